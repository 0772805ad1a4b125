//! Schema evolution, the plan: what changed between the schema a graph
//! records (its `.pg` at creation) and the one a config now names, each
//! change classed by what it asks of the stored rows. Pure: no Lance, no
//! I/O; `compat` decides what a start does with the plan.
//!
//! - `additive`: old rows stay valid and gain nothing but nulls (a new
//!   optional property, a new type);
//! - `loosening`: every committed row still passes (a required property
//!   made optional, more enum values, a wider `@range`, a dropped `@check`
//!   or `@unique`, a higher `@card` max);
//! - `tightening`: a constraint committed rows may break (a new `@check` or
//!   `@unique`, a narrower `@range`, fewer enum values, a lower `@card`
//!   max); it applies to records from then on, and is said at start;
//! - `destructive`: old rows or readers would break (a dropped or retyped
//!   property, a dropped type, an optional property made required, a new
//!   required property, a changed `@key` or edge endpoints). A rename is
//!   a drop and an add.

use std::collections::BTreeMap;
use std::fmt;

use arrow_schema::{DataType, Field};

use crate::schema::{Bound, Constraints, GraphSchema, GraphType, RangeCheck, TypeKind};

/// What a change asks of the stored rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Additive,
    Loosening,
    Tightening,
    Destructive,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Additive => "additive",
            Class::Loosening => "loosening",
            Class::Tightening => "tightening",
            Class::Destructive => "destructive",
        }
    }
}

/// One change, as one line of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub class: Class,
    /// The type it is in.
    pub type_name: String,
    /// What changed, and for a destructive change the way forward.
    pub what: String,
    /// Whether it changes a table (a column, its nullability, a new table),
    /// not only what the checks accept.
    pub alters_table: bool,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<11} {}: {}",
            self.class.as_str(),
            self.type_name,
            self.what
        )
    }
}

/// Every change from `old` to `new`, types in `new`'s order then dropped
/// ones, each type's changes in a stable order.
pub(crate) fn diff(old: &GraphSchema, new: &GraphSchema) -> Vec<Change> {
    let mut out = Vec::new();
    let olds: BTreeMap<&str, &GraphType> = old.types.iter().map(|t| (t.name.as_str(), t)).collect();
    for t in &new.types {
        match olds.get(t.name.as_str()) {
            None => out.push(change(
                Class::Additive,
                t,
                format!("new {} type (table {})", kind(t.kind), t.table),
            )),
            Some(o) => diff_type(o, t, &mut out),
        }
    }
    for o in &old.types {
        if new.get(&o.name).is_none() {
            out.push(change(
                Class::Destructive,
                o,
                format!(
                    "{} type dropped: its table {} holds rows; a rebuild (docs/schema-evolution.md) drops a type",
                    kind(o.kind),
                    o.table
                ),
            ));
        }
    }
    out
}

fn kind(k: TypeKind) -> &'static str {
    match k {
        TypeKind::Node => "node",
        TypeKind::Edge => "edge",
    }
}

fn change(class: Class, t: &GraphType, what: String) -> Change {
    Change {
        class,
        type_name: t.name.clone(),
        what,
        // Constraints alone are loosened or tightened; everything else
        // (a new type, a column, nullability) is a table's.
        alters_table: matches!(class, Class::Additive | Class::Destructive),
    }
}

fn diff_type(old: &GraphType, new: &GraphType, out: &mut Vec<Change>) {
    let from = out.len();
    let mut push = |class, what: String| out.push(change(class, new, what));
    if old.kind != new.kind {
        push(
            Class::Destructive,
            format!("was a {}, is a {}", kind(old.kind), kind(new.kind)),
        );
        return;
    }
    if old.key != new.key {
        push(
            Class::Destructive,
            format!(
                "@key changed from ({}) to ({}): every id is made of the key",
                old.key.join(", "),
                new.key.join(", ")
            ),
        );
    }
    if let (Some(o), Some(n)) = (&old.ends, &new.ends) {
        if (&o.from, &o.to) != (&n.from, &n.to) {
            push(
                Class::Destructive,
                format!(
                    "endpoints changed from {} -> {} to {} -> {}",
                    o.from, o.to, n.from, n.to
                ),
            );
        }
        match (o.card_max, n.card_max) {
            (Some(a), Some(b)) if b > a => push(
                Class::Loosening,
                format!("@card max raised from {a} to {b}"),
            ),
            (Some(a), None) => push(Class::Loosening, format!("@card max {a} dropped")),
            (Some(a), Some(b)) if b < a => push(
                Class::Tightening,
                format!("@card max lowered from {a} to {b}: applies to edges from now on"),
            ),
            (None, Some(b)) => push(
                Class::Tightening,
                format!("@card max {b} added: applies to edges from now on"),
            ),
            _ => {}
        }
        if n.card_min > o.card_min {
            push(
                Class::Tightening,
                format!(
                    "@card min raised from {} to {}: applies to edges from now on",
                    o.card_min, n.card_min
                ),
            );
        } else if n.card_min < o.card_min {
            push(
                Class::Loosening,
                format!("@card min lowered from {} to {}", o.card_min, n.card_min),
            );
        }
    }
    properties(old, new, &mut push);
    constraints(&old.constraints, &new.constraints, &mut push);
    for c in out[from..]
        .iter_mut()
        .filter(|c| c.what.ends_with(NULLABLE))
    {
        c.alters_table = true;
    }
}

fn properties(old: &GraphType, new: &GraphType, push: &mut impl FnMut(Class, String)) {
    for f in new.properties.fields() {
        let Ok(o) = old.properties.field_with_name(f.name()) else {
            if f.is_nullable() {
                push(
                    Class::Additive,
                    format!("new optional property {}: {}", f.name(), type_text(f)),
                );
            } else {
                push(
                    Class::Destructive,
                    format!(
                        "new required property {}: rows already committed have no value; declare it optional ({}: {}?)",
                        f.name(),
                        f.name(),
                        type_text(f)
                    ),
                );
            }
            continue;
        };
        if o.data_type() != f.data_type() {
            let how = if widens(o.data_type(), f.data_type()) {
                "widening a type needs the MemWAL drained and re-initialised around it, which graphsink does not do"
            } else {
                "rows already committed hold the old type"
            };
            push(
                Class::Destructive,
                format!(
                    "property {} retyped from {} to {}: {how}",
                    f.name(),
                    type_text(o),
                    type_text(f)
                ),
            );
        }
        match (o.is_nullable(), f.is_nullable()) {
            (false, true) => push(
                Class::Loosening,
                format!("property {} made optional{NULLABLE}", f.name()),
            ),
            (true, false) => push(
                Class::Destructive,
                format!(
                    "property {} made required: rows already committed may lack it",
                    f.name()
                ),
            ),
            _ => {}
        }
    }
    for o in old.properties.fields() {
        if new.properties.field_with_name(o.name()).is_err() {
            push(
                Class::Destructive,
                format!(
                    "property {} dropped: its column holds values (a rename is a drop and an add)",
                    o.name()
                ),
            );
        }
    }
}

/// Marks a loosening that alters the column (`diff_type` reads it).
const NULLABLE: &str = " (the column becomes nullable)";

/// A numeric widening Avro or Iceberg would allow (I32→I64, F32→F64,
/// U32→U64, and an integer into a wider one).
fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    matches!(
        (from, to),
        (Int8 | Int16, Int32 | Int64)
            | (Int32, Int64)
            | (UInt8 | UInt16, UInt32 | UInt64)
            | (UInt32, UInt64)
            | (Float32, Float64)
    )
}

fn type_text(f: &Field) -> String {
    f.data_type().to_string()
}

/// Said of a tightened constraint: it is not checked against committed rows.
const FROM_NOW: &str = ": applies to records from now on";

fn constraints(old: &Constraints, new: &Constraints, push: &mut impl FnMut(Class, String)) {
    enums(old, new, push);
    ranges(old, new, push);
    checks_and_uniques(old, new, push);
}

fn enums(old: &Constraints, new: &Constraints, push: &mut impl FnMut(Class, String)) {
    let from_now = FROM_NOW;
    for (p, values) in &new.enums {
        match old.enums.iter().find(|(q, _)| q == p) {
            None => push(
                Class::Tightening,
                format!("property {p} became enum({}){from_now}", values.join(", ")),
            ),
            Some((_, was)) => {
                let added: Vec<&str> = values
                    .iter()
                    .filter(|v| !was.contains(v))
                    .map(String::as_str)
                    .collect();
                let removed: Vec<&str> = was
                    .iter()
                    .filter(|v| !values.contains(v))
                    .map(String::as_str)
                    .collect();
                if !added.is_empty() {
                    push(
                        Class::Loosening,
                        format!("enum {p} gains {}", added.join(", ")),
                    );
                }
                if !removed.is_empty() {
                    push(
                        Class::Tightening,
                        format!("enum {p} loses {}{from_now}", removed.join(", ")),
                    );
                }
            }
        }
    }
    for (p, _) in &old.enums {
        if !new.enums.iter().any(|(q, _)| q == p) {
            push(
                Class::Loosening,
                format!("property {p} is no longer an enum"),
            );
        }
    }
}

fn ranges(old: &Constraints, new: &Constraints, push: &mut impl FnMut(Class, String)) {
    let from_now = FROM_NOW;
    for r in &new.ranges {
        match old.ranges.iter().find(|q| q.property == r.property) {
            None => push(
                Class::Tightening,
                format!("@range({}, {}) added{from_now}", r.property, range_text(r)),
            ),
            Some(o) => {
                let (lo_wider, lo_narrower) = compare(o.min, r.min, |a, b| a < b);
                let (hi_wider, hi_narrower) = compare(o.max, r.max, |a, b| a > b);
                if lo_narrower || hi_narrower {
                    push(
                        Class::Tightening,
                        format!(
                            "@range({}) narrowed from {} to {}{from_now}",
                            r.property,
                            range_text(o),
                            range_text(r)
                        ),
                    );
                } else if lo_wider || hi_wider {
                    push(
                        Class::Loosening,
                        format!(
                            "@range({}) widened from {} to {}",
                            r.property,
                            range_text(o),
                            range_text(r)
                        ),
                    );
                }
            }
        }
    }
    for o in &old.ranges {
        if !new.ranges.iter().any(|r| r.property == o.property) {
            push(Class::Loosening, format!("@range({}) dropped", o.property));
        }
    }
}

fn checks_and_uniques(old: &Constraints, new: &Constraints, push: &mut impl FnMut(Class, String)) {
    let from_now = FROM_NOW;
    for (p, re) in &new.checks {
        match old.checks.iter().find(|(q, _)| q == p) {
            Some((_, was)) if was == re => {}
            Some((_, was)) => push(
                Class::Tightening,
                format!("@check({p}) changed from {was:?} to {re:?}{from_now}"),
            ),
            None => push(
                Class::Tightening,
                format!("@check({p}, {re:?}) added{from_now}"),
            ),
        }
    }
    for (p, _) in &old.checks {
        if !new.checks.iter().any(|(q, _)| q == p) {
            push(Class::Loosening, format!("@check({p}) dropped"));
        }
    }
    // @unique
    for u in &new.uniques {
        if !old.uniques.contains(u) {
            push(
                Class::Tightening,
                format!("@unique({}) added{from_now}", u.join(", ")),
            );
        }
    }
    for u in &old.uniques {
        if !new.uniques.contains(u) {
            push(
                Class::Loosening,
                format!("@unique({}) dropped", u.join(", ")),
            );
        }
    }
}

/// For one bound, old → new: (wider, narrower). `outer(a, b)`: `a` lies
/// outside `b` (a lower min, or a higher max). An open bound is widest.
fn compare(
    old: Option<Bound>,
    new: Option<Bound>,
    outer: impl Fn(f64, f64) -> bool,
) -> (bool, bool) {
    let v = |b: Bound| match b {
        Bound::Int(i) => i as f64,
        Bound::Float(f) => f,
    };
    match (old, new) {
        (None, None) => (false, false),
        (Some(_), None) => (true, false),
        (None, Some(_)) => (false, true),
        (Some(a), Some(b)) => (outer(v(b), v(a)), outer(v(a), v(b))),
    }
}

fn range_text(r: &RangeCheck) -> String {
    let b = |b: Option<Bound>| match b {
        None => String::new(),
        Some(Bound::Int(i)) => i.to_string(),
        Some(Bound::Float(f)) => f.to_string(),
    };
    format!("{}..{}", b(r.min), b(r.max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(pg: &str) -> GraphSchema {
        GraphSchema::parse(pg, "t.pg").unwrap()
    }

    fn lines(old: &str, new: &str) -> Vec<String> {
        diff(&schema(old), &schema(new))
            .iter()
            .map(|c| c.to_string())
            .collect()
    }

    const BASE: &str = r#"
        node Person { name: String @key  age: I32  email: String?  tier: enum(gold, silver)?
                      @range(age, 0..150)  @check(email, "^.+@.+$") }
        edge Knows: Person -> Person @card(0..5) { since: I32? }
    "#;

    #[test]
    fn the_same_schema_has_no_changes() {
        assert!(lines(BASE, BASE).is_empty());
    }

    #[test]
    fn additive_changes() {
        let new = r#"
            node Person { name: String @key  age: I32  email: String?  tier: enum(gold, silver)?
                          phone: String?
                          @range(age, 0..150)  @check(email, "^.+@.+$") }
            node City { name: String @key }
            edge Knows: Person -> Person @card(0..5) { since: I32? }
            edge LivesIn: Person -> City
        "#;
        assert_eq!(
            lines(BASE, new),
            [
                "additive    City: new node type (table nodes/City)",
                "additive    Person: new optional property phone: Utf8",
                "additive    LivesIn: new edge type (table edges/LivesIn)",
            ]
        );
    }

    #[test]
    fn loosening_changes() {
        let new = r#"
            node Person { name: String @key  age: I32?  email: String?  tier: enum(gold, silver, bronze)?
                          @range(age, 0..200) }
            edge Knows: Person -> Person @card(0..9) { since: I32? }
        "#;
        let got = lines(BASE, new);
        assert_eq!(
            got,
            [
                "loosening   Person: property age made optional (the column becomes nullable)",
                "loosening   Person: enum tier gains bronze",
                "loosening   Person: @range(age) widened from 0..150 to 0..200",
                "loosening   Person: @check(email) dropped",
                "loosening   Knows: @card max raised from 5 to 9",
            ],
            "{got:#?}"
        );
    }

    /// What a start may apply now: constraint changes only; a nullability
    /// change is a loosening that still alters the column.
    #[test]
    fn only_constraint_changes_leave_the_tables_alone() {
        let new = r#"
            node Person { name: String @key  age: I32?  email: String?  tier: enum(gold, silver)?
                          @range(age, 0..200) }
            edge Knows: Person -> Person @card(0..5) { since: I32? }
        "#;
        let alters: Vec<(bool, String)> = diff(&schema(BASE), &schema(new))
            .into_iter()
            .map(|c| (c.alters_table, c.what))
            .collect();
        assert_eq!(
            alters,
            [
                (
                    true,
                    "property age made optional (the column becomes nullable)".to_string()
                ),
                (
                    false,
                    "@range(age) widened from 0..150 to 0..200".to_string()
                ),
                (false, "@check(email) dropped".to_string()),
            ]
        );
    }

    #[test]
    fn tightening_changes_apply_from_now_on() {
        let new = r#"
            node Person { name: String @key  age: I32  email: String?  tier: enum(gold)?
                          @range(age, 18..150)  @check(email, "^[a-z]+@.+$")  @unique(email) }
            edge Knows: Person -> Person @card(0..2) { since: I32? }
        "#;
        let got = lines(BASE, new);
        assert!(
            got.iter()
                .all(|l| l.starts_with("tightening") && l.ends_with("from now on")),
            "{got:#?}"
        );
        assert_eq!(got.len(), 5, "{got:#?}");
    }

    #[test]
    fn destructive_changes_each_by_name() {
        let new = r#"
            node Person { name: String  age: I64  email: String  nick: String  born: Date
                          @key(name, born) }
            edge Knows: Person -> Person @card(0..5) { since: I32? }
        "#;
        let got = lines(BASE, new);
        let destructive: Vec<&String> = got
            .iter()
            .filter(|l| l.starts_with("destructive"))
            .collect();
        for want in [
            "@key changed from (name) to (name, born)",
            "property age retyped from Int32 to Int64: widening",
            "property email made required",
            "new required property nick",
            "property tier dropped",
        ] {
            assert!(
                destructive.iter().any(|l| l.contains(want)),
                "{want:?} not in {got:#?}"
            );
        }
        let dropped = lines(BASE, "node Person { name: String @key  age: I32  email: String?  tier: enum(gold, silver)?  @range(age, 0..150)  @check(email, \"^.+@.+$\") }");
        assert_eq!(
            dropped,
            ["destructive Knows: edge type dropped: its table edges/Knows holds rows; a rebuild (docs/schema-evolution.md) drops a type"]
        );
    }
}
