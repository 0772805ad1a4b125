//! Kafka ACLs, granted, revoked and listed through librdkafka's admin API
//! (CreateAcls, DeleteAcls, DescribeAcls). The rdkafka crate wraps none of
//! them, so this calls the C functions its `bindings` re-export, on the
//! native handle of an admin client: a round trip in milliseconds, where
//! Kafka's `AclCommand` costs a JVM start (about 3 s here) per call.

use std::ffi::{CStr, CString};
use std::fmt;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;

/// A resource type, as Kafka names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    Topic,
    Group,
    TransactionalId,
    /// The cluster (its one name is `kafka-cluster`).
    Cluster,
}

/// An operation, as Kafka names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
}

/// How an ACL's resource name matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PatternType {
    Literal,
    Prefixed,
}

/// One ALLOW rule: `principal` may do `operation` on the resource, from any
/// host. (The harness never needs DENY rules: deny by default is the
/// cluster's setting.)
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Acl {
    /// `User:NAME`.
    pub principal: String,
    pub operation: Operation,
    pub resource: ResourceType,
    pub name: String,
    pub pattern: PatternType,
}

impl Acl {
    /// `User:user` may do `operation` on the literal resource `name`.
    pub fn allow(user: &str, operation: Operation, resource: ResourceType, name: &str) -> Acl {
        Acl {
            principal: format!("User:{user}"),
            operation,
            resource,
            name: name.to_owned(),
            pattern: PatternType::Literal,
        }
    }

    /// The same rule on every resource whose name starts with `name`.
    pub fn prefixed(mut self) -> Acl {
        self.pattern = PatternType::Prefixed;
        self
    }

    /// `User:user` may do `operation` on the cluster.
    pub fn on_cluster(user: &str, operation: Operation) -> Acl {
        Acl::allow(user, operation, ResourceType::Cluster, "kafka-cluster")
    }

    /// What graphsink's principal needs for a run with a dead-letter topic
    /// and fold-reject transactions: the list docs/security.md gives, each
    /// one shown needed by tests/e2e/security.rs (revoked, the run exits 5
    /// naming it). DESCRIBE is in none of them: Kafka implies it from READ
    /// and WRITE.
    pub fn graphsink_needs(user: &str, topics: &[&str], group: &str, dlq: &str) -> Vec<Acl> {
        let mut acls: Vec<Acl> = topics
            .iter()
            .map(|t| Acl::allow(user, Operation::Read, ResourceType::Topic, t))
            .collect();
        acls.push(Acl::allow(
            user,
            Operation::Read,
            ResourceType::Group,
            group,
        ));
        // WRITE for rejects; READ for the fold's read-back of its rejects
        // before it produces them (docs/dead-letters.md).
        acls.push(Acl::allow(user, Operation::Write, ResourceType::Topic, dlq));
        acls.push(Acl::allow(user, Operation::Read, ResourceType::Topic, dlq));
        acls.push(Acl::fold_transactions(user));
        acls
    }

    /// The fold-reject producer's transactions: its transactional.id is
    /// graphsink-fold-<uuid v5 of the graph root>, so a prefix grant
    /// covers every root.
    pub fn fold_transactions(user: &str) -> Acl {
        Acl::allow(
            user,
            Operation::Write,
            ResourceType::TransactionalId,
            "graphsink-fold-",
        )
        .prefixed()
    }
}

/// As Kafka's tools print it: `User:graphsink READ TOPIC people (LITERAL)`.
impl fmt::Display for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} ({})",
            self.principal,
            operation_name(self.operation),
            resource_name(self.resource),
            self.name,
            match self.pattern {
                PatternType::Literal => "LITERAL",
                PatternType::Prefixed => "PREFIXED",
            }
        )
    }
}

fn operation_name(op: Operation) -> &'static str {
    match op {
        Operation::All => "ALL",
        Operation::Read => "READ",
        Operation::Write => "WRITE",
        Operation::Create => "CREATE",
        Operation::Delete => "DELETE",
        Operation::Alter => "ALTER",
        Operation::Describe => "DESCRIBE",
        Operation::ClusterAction => "CLUSTER_ACTION",
        Operation::DescribeConfigs => "DESCRIBE_CONFIGS",
        Operation::AlterConfigs => "ALTER_CONFIGS",
        Operation::IdempotentWrite => "IDEMPOTENT_WRITE",
    }
}

fn resource_name(r: ResourceType) -> &'static str {
    match r {
        ResourceType::Topic => "TOPIC",
        ResourceType::Group => "GROUP",
        ResourceType::TransactionalId => "TRANSACTIONAL_ID",
        ResourceType::Cluster => "CLUSTER",
    }
}

fn rd_operation(op: Operation) -> rd::rd_kafka_AclOperation_t {
    use rd::rd_kafka_AclOperation_t::*;
    match op {
        Operation::All => RD_KAFKA_ACL_OPERATION_ALL,
        Operation::Read => RD_KAFKA_ACL_OPERATION_READ,
        Operation::Write => RD_KAFKA_ACL_OPERATION_WRITE,
        Operation::Create => RD_KAFKA_ACL_OPERATION_CREATE,
        Operation::Delete => RD_KAFKA_ACL_OPERATION_DELETE,
        Operation::Alter => RD_KAFKA_ACL_OPERATION_ALTER,
        Operation::Describe => RD_KAFKA_ACL_OPERATION_DESCRIBE,
        Operation::ClusterAction => RD_KAFKA_ACL_OPERATION_CLUSTER_ACTION,
        Operation::DescribeConfigs => RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        Operation::AlterConfigs => RD_KAFKA_ACL_OPERATION_ALTER_CONFIGS,
        Operation::IdempotentWrite => RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE,
    }
}

fn from_rd_operation(op: rd::rd_kafka_AclOperation_t) -> Option<Operation> {
    use rd::rd_kafka_AclOperation_t::*;
    Some(match op {
        RD_KAFKA_ACL_OPERATION_ALL => Operation::All,
        RD_KAFKA_ACL_OPERATION_READ => Operation::Read,
        RD_KAFKA_ACL_OPERATION_WRITE => Operation::Write,
        RD_KAFKA_ACL_OPERATION_CREATE => Operation::Create,
        RD_KAFKA_ACL_OPERATION_DELETE => Operation::Delete,
        RD_KAFKA_ACL_OPERATION_ALTER => Operation::Alter,
        RD_KAFKA_ACL_OPERATION_DESCRIBE => Operation::Describe,
        RD_KAFKA_ACL_OPERATION_CLUSTER_ACTION => Operation::ClusterAction,
        RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS => Operation::DescribeConfigs,
        RD_KAFKA_ACL_OPERATION_ALTER_CONFIGS => Operation::AlterConfigs,
        RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE => Operation::IdempotentWrite,
        _ => return None,
    })
}

// librdkafka's BROKER resource type is Kafka's CLUSTER (code 4 on the wire).
fn rd_resource(r: ResourceType) -> rd::rd_kafka_ResourceType_t {
    use rd::rd_kafka_ResourceType_t::*;
    match r {
        ResourceType::Topic => RD_KAFKA_RESOURCE_TOPIC,
        ResourceType::Group => RD_KAFKA_RESOURCE_GROUP,
        ResourceType::TransactionalId => RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
        ResourceType::Cluster => RD_KAFKA_RESOURCE_BROKER,
    }
}

fn from_rd_resource(r: rd::rd_kafka_ResourceType_t) -> Option<ResourceType> {
    use rd::rd_kafka_ResourceType_t::*;
    Some(match r {
        RD_KAFKA_RESOURCE_TOPIC => ResourceType::Topic,
        RD_KAFKA_RESOURCE_GROUP => ResourceType::Group,
        RD_KAFKA_RESOURCE_TRANSACTIONAL_ID => ResourceType::TransactionalId,
        RD_KAFKA_RESOURCE_BROKER => ResourceType::Cluster,
        _ => return None,
    })
}

fn rd_pattern(p: PatternType) -> rd::rd_kafka_ResourcePatternType_t {
    match p {
        PatternType::Literal => {
            rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL
        }
        PatternType::Prefixed => {
            rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_PREFIXED
        }
    }
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} holds a NUL byte"))
}

unsafe fn text(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// An error object's `NAME: message`, or `None` for no error.
unsafe fn error_text(e: *const rd::rd_kafka_error_t) -> Option<String> {
    if e.is_null() {
        return None;
    }
    Some(format!(
        "{}: {}",
        text(rd::rd_kafka_error_name(e)),
        text(rd::rd_kafka_error_string(e))
    ))
}

/// Owned ACL binding objects (bindings or filters), destroyed on drop.
struct Bindings(Vec<*mut rd::rd_kafka_AclBinding_t>);

impl Drop for Bindings {
    fn drop(&mut self) {
        for b in self.0.drain(..) {
            // SAFETY: each pointer came from AclBinding(Filter)_new and is
            // destroyed once; librdkafka copies what the request needs.
            unsafe { rd::rd_kafka_AclBinding_destroy(b) };
        }
    }
}

/// A binding (`filter`: false) or a filter (true) matching `acl` exactly.
fn binding(acl: &Acl, filter: bool) -> Result<*mut rd::rd_kafka_AclBinding_t, String> {
    let name = cstring(&acl.name)?;
    let principal = cstring(&acl.principal)?;
    let host = cstring("*")?;
    let mut err = [0 as std::os::raw::c_char; 512];
    let new = if filter {
        rd::rd_kafka_AclBindingFilter_new
    } else {
        rd::rd_kafka_AclBinding_new
    };
    // SAFETY: every string is NUL-terminated and outlives the call, which
    // copies them; errstr is a writable buffer of the given size.
    let b = unsafe {
        new(
            rd_resource(acl.resource),
            name.as_ptr(),
            rd_pattern(acl.pattern),
            principal.as_ptr(),
            host.as_ptr(),
            rd_operation(acl.operation),
            rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if b.is_null() {
        // SAFETY: librdkafka wrote a NUL-terminated message into err.
        return Err(format!("ACL {acl}: {}", unsafe { text(err.as_ptr()) }));
    }
    Ok(b)
}

/// Runs one admin request on its own queue and hands its result event to
/// `read`. The queue is private, so the admin client's own poller never
/// sees the event.
fn request<T>(
    admin: &AdminClient<DefaultClientContext>,
    op: rd::rd_kafka_admin_op_t,
    broker: Option<i32>,
    timeout: Duration,
    send: impl FnOnce(
        *mut rd::rd_kafka_t,
        *const rd::rd_kafka_AdminOptions_t,
        *mut rd::rd_kafka_queue_t,
    ),
    read: impl FnOnce(*mut rd::rd_kafka_event_t) -> Result<T, String>,
) -> Result<T, String> {
    let rk = admin.inner().native_ptr();
    // SAFETY: rk is the live handle of `admin`, which outlives this call;
    // the options, queue and event are destroyed below, once each.
    unsafe {
        let options = rd::rd_kafka_AdminOptions_new(rk, op);
        let mut err = [0 as std::os::raw::c_char; 512];
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        rd::rd_kafka_AdminOptions_set_request_timeout(options, ms, err.as_mut_ptr(), err.len());
        if let Some(id) = broker {
            rd::rd_kafka_AdminOptions_set_broker(options, id, err.as_mut_ptr(), err.len());
        }
        let queue = rd::rd_kafka_queue_new(rk);
        send(rk, options, queue);
        // The request times out by itself; poll a little longer than that.
        let event = rd::rd_kafka_queue_poll(queue, ms.saturating_add(5000));
        let out = if event.is_null() {
            Err(format!("no answer within {} s", timeout.as_secs() + 5))
        } else if rd::rd_kafka_event_error(event)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            Err(text(rd::rd_kafka_event_error_string(event)))
        } else {
            read(event)
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_queue_destroy(queue);
        rd::rd_kafka_AdminOptions_destroy(options);
        out
    }
}

/// Creates `acls` (ALLOW, any host) in one CreateAcls request. Creating an
/// ACL that exists is not an error (Kafka's own semantics).
pub fn create(
    admin: &AdminClient<DefaultClientContext>,
    acls: &[Acl],
    timeout: Duration,
) -> Result<(), String> {
    if acls.is_empty() {
        return Ok(());
    }
    let mut bindings = Bindings(Vec::with_capacity(acls.len()));
    for a in acls {
        bindings.0.push(binding(a, false)?);
    }
    request(
        admin,
        rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_CREATEACLS,
        None,
        timeout,
        // SAFETY (the closures): the arguments come from `request`; the
        // bindings live until after the call, which copies them.
        |rk, options, queue| unsafe {
            rd::rd_kafka_CreateAcls(
                rk,
                bindings.0.as_mut_ptr(),
                bindings.0.len(),
                options,
                queue,
            )
        },
        |event| unsafe {
            let result = rd::rd_kafka_event_CreateAcls_result(event);
            let mut n = 0;
            let results = rd::rd_kafka_CreateAcls_result_acls(result, &mut n);
            let mut errors = Vec::new();
            for (i, acl) in acls.iter().enumerate().take(n) {
                if let Some(e) = error_text(rd::rd_kafka_acl_result_error(*results.add(i))) {
                    errors.push(format!("{acl}: {e}"));
                }
            }
            if errors.is_empty() {
                Ok(())
            } else {
                Err(format!("CreateAcls refused: {}", errors.join("; ")))
            }
        },
    )
}

/// Deletes every ALLOW ACL matching one of `acls` exactly (one DeleteAcls
/// request); returns those it deleted. None matching is not an error.
pub fn delete(
    admin: &AdminClient<DefaultClientContext>,
    acls: &[Acl],
    timeout: Duration,
) -> Result<Vec<Acl>, String> {
    if acls.is_empty() {
        return Ok(Vec::new());
    }
    let mut filters = Bindings(Vec::with_capacity(acls.len()));
    for a in acls {
        filters.0.push(binding(a, true)?);
    }
    request(
        admin,
        rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DELETEACLS,
        None,
        timeout,
        |rk, options, queue| unsafe {
            rd::rd_kafka_DeleteAcls(rk, filters.0.as_mut_ptr(), filters.0.len(), options, queue)
        },
        |event| unsafe {
            let result = rd::rd_kafka_event_DeleteAcls_result(event);
            let mut n = 0;
            let responses = rd::rd_kafka_DeleteAcls_result_responses(result, &mut n);
            let mut deleted = Vec::new();
            let mut errors = Vec::new();
            for (i, acl) in acls.iter().enumerate().take(n) {
                let r = *responses.add(i);
                if let Some(e) = error_text(rd::rd_kafka_DeleteAcls_result_response_error(r)) {
                    errors.push(format!("{acl}: {e}"));
                    continue;
                }
                let mut m = 0;
                let matching = rd::rd_kafka_DeleteAcls_result_response_matching_acls(r, &mut m);
                deleted.extend((0..m).filter_map(|j| read_binding(*matching.add(j))));
            }
            if errors.is_empty() {
                Ok(deleted)
            } else {
                Err(format!("DeleteAcls refused: {}", errors.join("; ")))
            }
        },
    )
}

/// Every ALLOW ACL of the cluster (DescribeAcls with a filter matching
/// all), sorted, as broker `broker` (any, for `None`) knows them: each
/// broker applies a change when its copy of the metadata log reaches it,
/// a moment after the controller committed it.
pub fn list(
    admin: &AdminClient<DefaultClientContext>,
    broker: Option<i32>,
    timeout: Duration,
) -> Result<Vec<Acl>, String> {
    let mut err = [0 as std::os::raw::c_char; 512];
    // SAFETY: a filter of nulls and ANYs; destroyed by `Bindings`.
    let filter = unsafe {
        rd::rd_kafka_AclBindingFilter_new(
            rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_ANY,
            std::ptr::null(),
            rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_ANY,
            std::ptr::null(),
            std::ptr::null(),
            rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_ANY,
            rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ANY,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if filter.is_null() {
        // SAFETY: librdkafka wrote a NUL-terminated message into err.
        return Err(format!("ACL filter: {}", unsafe { text(err.as_ptr()) }));
    }
    let filter = Bindings(vec![filter]);
    request(
        admin,
        rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBEACLS,
        broker,
        timeout,
        |rk, options, queue| unsafe { rd::rd_kafka_DescribeAcls(rk, filter.0[0], options, queue) },
        |event| unsafe {
            let result = rd::rd_kafka_event_DescribeAcls_result(event);
            let mut n = 0;
            let acls = rd::rd_kafka_DescribeAcls_result_acls(result, &mut n);
            let mut out: Vec<Acl> = (0..n).filter_map(|i| read_binding(*acls.add(i))).collect();
            out.sort();
            Ok(out)
        },
    )
}

/// An ALLOW binding of a result as an [`Acl`]; `None` for a DENY rule or a
/// kind this module does not name.
unsafe fn read_binding(b: *const rd::rd_kafka_AclBinding_t) -> Option<Acl> {
    if rd::rd_kafka_AclBinding_permission_type(b)
        != rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW
    {
        return None;
    }
    let pattern = match rd::rd_kafka_AclBinding_resource_pattern_type(b) {
        rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL => {
            PatternType::Literal
        }
        rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_PREFIXED => {
            PatternType::Prefixed
        }
        _ => return None,
    };
    Some(Acl {
        principal: text(rd::rd_kafka_AclBinding_principal(b)),
        operation: from_rd_operation(rd::rd_kafka_AclBinding_operation(b))?,
        resource: from_rd_resource(rd::rd_kafka_AclBinding_restype(b))?,
        name: text(rd::rd_kafka_AclBinding_name(b)),
        pattern,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acl_reads_as_kafka_names_it() {
        let a = Acl::allow("graphsink", Operation::Read, ResourceType::Topic, "people");
        assert_eq!(a.to_string(), "User:graphsink READ TOPIC people (LITERAL)");
        let c = Acl::on_cluster("graphsink", Operation::IdempotentWrite);
        assert_eq!(
            c.to_string(),
            "User:graphsink IDEMPOTENT_WRITE CLUSTER kafka-cluster (LITERAL)"
        );
        let p = Acl::allow(
            "g",
            Operation::Write,
            ResourceType::TransactionalId,
            "graphsink-fold-",
        )
        .prefixed();
        assert_eq!(
            p.to_string(),
            "User:g WRITE TRANSACTIONAL_ID graphsink-fold- (PREFIXED)"
        );
    }

    #[test]
    fn a_binding_is_made_for_every_kind() {
        for r in [
            ResourceType::Topic,
            ResourceType::Group,
            ResourceType::TransactionalId,
            ResourceType::Cluster,
        ] {
            let a = Acl::allow("u", Operation::Describe, r, "x");
            let b = Bindings(vec![binding(&a, false).expect("binding")]);
            // SAFETY: a binding just made.
            assert_eq!(unsafe { read_binding(b.0[0]) }, Some(a));
        }
    }
}
