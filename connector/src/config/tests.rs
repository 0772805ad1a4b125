//! The config's tests: defaults, validation, `${VAR}`s, and docs/config.md
//! against the structs.

use super::*;

/// The sections that may be omitted: each is its `impl Default`.
const SECTIONS_WITH_DEFAULTS: [&str; 9] = [
    "wal",
    "fold",
    "offsets",
    "errors",
    "retention",
    "http",
    "log",
    "runtime",
    "schema_registry",
];

/// docs/config.md lists, under each section's heading, exactly the keys
/// that section accepts, as serde itself names them (its "expected one
/// of" list for an unknown key).
#[test]
fn docs_config_lists_every_key() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md"))
        .expect("docs/config.md");
    let base = "[graph]\nroot = \"g\"\nschema = \"x.pg\"\n[kafka]\n\"bootstrap.servers\" = \"h:1\"\n\"group.id\" = \"g\"\n";
    let sections = ["graph"]
        .into_iter()
        .chain(SECTIONS_WITH_DEFAULTS)
        .chain(["mapping"]);
    let ticked = |s: &str| -> std::collections::BTreeSet<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    for section in sections {
        let toml = match section {
            "graph" => base.replace("[graph]\n", "[graph]\nzz_unknown = 1\n"),
            "mapping" => {
                format!("{base}[[mapping]]\nzz_unknown = 1\ntopic = \"t\"\nnode = \"P\"\n")
            }
            s => format!("{base}[{s}]\nzz_unknown = 1\n"),
        };
        let err = Config::from_toml(&toml, Path::new("."))
            .unwrap_err()
            .to_string();
        let accepted = ticked(
            err.split("expected")
                .nth(1)
                .unwrap_or_else(|| panic!("{section}: {err}")),
        );
        let heading = match section {
            "mapping" => "### `[[mapping]]`".to_string(),
            s => format!("### `[{s}]`"),
        };
        let at = doc
            .find(&heading)
            .unwrap_or_else(|| panic!("docs/config.md has no {heading}"));
        let documented: std::collections::BTreeSet<String> = doc[at..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .flat_map(|l| ticked(l.split('|').nth(1).unwrap_or("")))
            .collect();
        assert_eq!(
            documented, accepted,
            "[{section}]: docs/config.md (left) against the struct (right)"
        );
    }
}

/// Each section's defaults live in one place, its `impl Default`: a
/// config that omits the section, and one that names it empty, both
/// read as exactly that.
#[test]
fn an_omitted_or_empty_section_is_its_default() {
    let dir = std::path::Path::new(".");
    let empty = SECTIONS_WITH_DEFAULTS
        .iter()
        .fold(MIN.to_string(), |t, s| format!("{t}\n[{s}]\n"));
    for text in [MIN.to_string(), empty] {
        let c = Config::from_toml(&text, dir).unwrap();
        let got = format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            c.wal,
            c.fold,
            c.offsets,
            c.errors,
            c.retention,
            c.http,
            c.log,
            c.runtime,
            c.schema_registry
        );
        let want = format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            WalSettings::default(),
            FoldSettings::default(),
            OffsetSettings::default(),
            ErrorSettings::default(),
            RetentionSettings::default(),
            HttpSettings::default(),
            LogSettings::default(),
            RuntimeSettings::default(),
            SchemaRegistrySettings::default()
        );
        assert_eq!(got, want, "{text}");
    }
}

const MIN: &str = r#"
[graph]
root = "data/graph"
schema = "social.pg"
[kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "g"
[[mapping]]
topic = "people"
node = "Person"
"#;

/// `${VAR}` expands inside the storage options, and `Debug` (which is
/// how config reaches logs) shows harmless values only.
#[test]
fn storage_options_expand_and_never_show_secrets() {
    std::env::set_var("GS_TEST_SECRET_KEY", "s3cr3t-value-42");
    let t = MIN.replace("data/graph", "s3://bucket/prefix").replace(
        "schema = \"social.pg\"",
        "schema = \"social.pg\"\n[graph.storage_options]\n\
         aws_endpoint = \"http://127.0.0.1:9000\"\n\
         aws_secret_access_key = \"${GS_TEST_SECRET_KEY}\"\n\
         aws_session_token = \"tok-123\"",
    );
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert_eq!(c.root_uri(), "s3://bucket/prefix");
    let opts = &c.graph.storage_options.0;
    assert_eq!(opts["aws_secret_access_key"], "s3cr3t-value-42");
    let shown = format!("{c:?}");
    assert!(shown.contains("http://127.0.0.1:9000"), "{shown}");
    assert!(!shown.contains("s3cr3t-value-42"), "{shown}");
    assert!(!shown.contains("tok-123"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

/// `[schema_registry]`: defaults, the URL list, `${VAR}` credentials
/// kept out of `Debug` and out of every printed error.
#[test]
fn schema_registry_settings_default_list_urls_and_hide_credentials() {
    let c = Config::from_toml(MIN, Path::new("/")).unwrap();
    assert_eq!(c.mappings[0].format, ValueFormatName::Json);
    assert_eq!(c.mappings[0].key_format, KeyFormatName::Json);
    assert_eq!(c.schema_registry.timeout, Duration::from_secs(10));
    assert!(c.schema_registry.urls().is_empty());

    std::env::set_var("GS_TEST_REGISTRY_PASSWORD", "reg-pa55word");
    let t = format!(
        "{MIN}format = \"avro\"\nkey_format = \"string\"\n\
         [schema_registry]\nurl = \"http://a:8081/, https://b:8081\"\n\
         basic_auth_user_info = \"svc:${{GS_TEST_REGISTRY_PASSWORD}}\"\ntimeout = \"2s\"\n"
    );
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert_eq!(c.mappings[0].format, ValueFormatName::Avro);
    assert_eq!(c.mappings[0].key_format, KeyFormatName::String);
    assert_eq!(
        c.schema_registry.urls(),
        ["http://a:8081", "https://b:8081"]
    );
    assert_eq!(c.schema_registry.timeout, Duration::from_secs(2));
    let shown = format!("{c:?}");
    assert!(!shown.contains("reg-pa55word"), "{shown}");
    assert!(
        shown.contains("basic_auth_user_info: Some(\"<redacted>\")"),
        "{shown}"
    );
    assert_eq!(redact::text("auth svc:reg-pa55word"), "auth <redacted>");
}

#[test]
fn registry_formats_need_a_registry_and_valid_settings() {
    let refused = |extra: &str, want: &str| {
        let t = format!("{MIN}{extra}");
        let e = Config::from_toml(&t, Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{extra:?}: {e}");
    };
    refused("format = \"protobuf\"\n", "schema_registry.url is required");
    refused(
        "key_format = \"avro\"\n",
        "topic people uses a registry format",
    );
    refused("format = \"xml\"\n", "unknown variant");
    refused("message = \"a.B\"\n", "neither format nor key_format");
    let with = |section: &str| format!("format = \"avro\"\n[schema_registry]\n{section}");
    refused(
        &with("url = \"registry:8081\"\n"),
        "not an http:// or https:// URL",
    );
    refused(
        &with("url = \"http://r\"\nbasic_auth_user_info = \"nopassword\"\n"),
        "user:password",
    );
    refused(
        &with("url = \"http://r\"\nbasic_auth_user_info = \"u:p\"\nbearer_token = \"t\"\n"),
        "one of basic_auth_user_info and bearer_token",
    );
    refused(
        &with("url = \"http://r\"\ncache_capacity = 0\n"),
        "cache_capacity",
    );
    refused(
        &with("url = \"http://r\"\nschema_url = \"x\"\n"),
        "unknown field",
    );
    // A registry named but unused is fine, and json_schema is a name.
    let t = format!("{MIN}format = \"json_schema\"\nmessage = \"x\"\n");
    assert!(Config::from_toml(&t, Path::new("/")).is_err());
    let t = format!("{MIN}[schema_registry]\nurl = \"http://r\"\n");
    Config::from_toml(&t, Path::new("/")).unwrap();
}

#[test]
fn an_unknown_root_scheme_is_refused_at_load() {
    let t = MIN.replace("data/graph", "s4://bucket/x");
    let e = Config::from_toml(&t, Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("s4://"), "{e}");
    for ok in ["s3://b/p", "gs://b/p", "az://c/p", "file:///tmp/g"] {
        let t = MIN.replace("data/graph", ok);
        Config::from_toml(&t, Path::new("/")).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn defaults_apply() {
    let c = Config::from_toml(MIN, Path::new("/etc/gs")).unwrap();
    assert_eq!(c.wal.buckets, None);
    assert_eq!(c.wal.sharding, Sharding::Bucket);
    assert_eq!(c.root_uri(), "/etc/gs/data/graph");
    assert_eq!(c.mappings[0].node_key(), KeySource::Named(KeyOrigin::Value));
    assert_eq!(c.mappings[0].unknown_fields, UnknownFields::Reject);
    assert_eq!(c.errors.tolerance, Tolerance::All);
    assert_eq!(c.dead_letter_topic("people"), "graphsink-dead-letters");
}

/// `[runtime]` is read twice: before the runtime exists (`runtime_of`,
/// which falls back to the defaults) and in the full load (which refuses
/// a bad value, so a typo is not silently the default).
#[test]
fn runtime_settings_default_read_early_and_refuse_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.toml");
    assert_eq!(
        Config::runtime_of(&path).background_nice,
        10,
        "unreadable: default"
    );
    std::fs::write(&path, format!("{MIN}\n[runtime]\nbackground_nice = 0\n")).unwrap();
    assert_eq!(Config::runtime_of(&path).background_nice, 0);
    let c = Config::load(&path).unwrap();
    assert_eq!(c.runtime.background_nice, 0);
    let bad = format!("{MIN}\n[runtime]\nbackground_nice = 20\n");
    let e = Config::from_toml(&bad, Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("runtime.background_nice"), "{e}");
    std::fs::write(&path, bad).unwrap();
    assert_eq!(Config::runtime_of(&path).background_nice, 10);
}

#[test]
fn unknown_key_is_an_error() {
    let text = MIN.replace("[graph]", "[graph]\nroots = 1");
    let e = Config::from_toml(&text, Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("roots"), "{e}");
}

#[test]
fn env_expansion_and_missing_var() {
    std::env::set_var("GS_TEST_SECRET", "s3cr3t");
    let text = format!("{MIN}\n[kafka.x]\n");
    let _ = text;
    let t = MIN.replace("\"g\"", "\"${GS_TEST_SECRET}\"");
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert_eq!(c.kafka["group.id"], "s3cr3t");
    let t = MIN.replace("\"g\"", "\"${GS_TEST_NOPE_UNSET}\"");
    let e = Config::from_toml(&t, Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("GS_TEST_NOPE_UNSET"), "{e}");
}

/// The commands that only read the graph resolve `[graph]` alone: a
/// `${VAR}` that `[kafka]` uses and nobody set fails a full load (naming
/// it), not a read's; one in `[graph]` must still be set.
#[test]
fn a_read_resolves_only_the_graph_section() {
    std::env::set_var("GS_TEST_READ_ROOT", "from-env");
    let t = MIN
        .replace("127.0.0.1:9092", "${GS_TEST_UNSET_BROKER}")
        .replace("\"data/graph\"", "\"${GS_TEST_READ_ROOT}/graph/\"");
    let e = Config::from_toml(&t, Path::new("/etc/gs")).unwrap_err();
    assert!(e.to_string().contains("GS_TEST_UNSET_BROKER"), "{e}");
    let c = Config::graph_of_toml(&t, Path::new("/etc/gs")).unwrap();
    assert_eq!(c.root_uri(), "/etc/gs/from-env/graph");
    assert_eq!(c.schema_path(), Path::new("/etc/gs/social.pg"));
    assert!(c.kafka.is_empty() && c.mappings.is_empty());
    let t = t.replace("${GS_TEST_READ_ROOT}", "${GS_TEST_UNSET_ROOT}");
    let e = Config::graph_of_toml(&t, Path::new("/etc/gs")).unwrap_err();
    assert!(
        e.to_string()
            .contains("graph.root: environment variable GS_TEST_UNSET_ROOT"),
        "{e}"
    );
    let e = Config::graph_of_toml("[kafka]\n", Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("[graph]"), "{e}");
}

#[test]
fn key_forms_parse() {
    let t = MIN.replace(
        "node = \"Person\"",
        "node = \"Person\"\nkey = { field = \"uid\" }",
    );
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert_eq!(
        c.mappings[0].node_key(),
        KeySource::Field {
            field: "uid".into()
        }
    );
    let t = MIN.replace("node = \"Person\"", "node = \"Person\"\nkey = \"kafka\"");
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert_eq!(c.mappings[0].node_key(), KeySource::Named(KeyOrigin::Kafka));
}

#[test]
fn edge_mappings_are_checked() {
    let edge = MIN.replace("node = \"Person\"", "edge = \"Knows\"\nsrc = \"from\"");
    let c = Config::from_toml(&edge, Path::new("/")).unwrap();
    assert!(c.mappings[0].is_edge());
    assert_eq!(c.mappings[0].src_field(), "from");
    assert_eq!(c.mappings[0].dst_field(), "dst");
    assert_eq!(c.mappings[0].on_missing_endpoint, EndpointPolicy::Defer);
    for bad in [
        MIN.replace("node = \"Person\"", "node = \"P\"\nedge = \"K\""),
        MIN.replace("node = \"Person\"", "edge = \"K\"\nkey = \"value\""),
        MIN.replace("node = \"Person\"", "node = \"P\"\nsrc = \"a\""),
        MIN.replace("node = \"Person\"", "edge = \"K\"\nsrc = \"dst\""),
    ] {
        assert!(Config::from_toml(&bad, Path::new("/")).is_err(), "{bad}");
    }
}

#[test]
fn retention_defaults_are_on_and_keep_an_hour_and_ten_commits() {
    let c = Config::from_toml(MIN, Path::new("/")).unwrap();
    let r = &c.retention;
    assert!(r.enabled);
    assert_eq!(r.interval, Duration::from_secs(60));
    assert_eq!(r.keep_commits, 10);
    assert_eq!(r.keep_for, Duration::from_secs(3600));
    assert_eq!(r.keep_for_ms(), 3_600_000);
}

#[test]
fn retention_keys_parse_and_are_checked() {
    let t = format!(
        "{MIN}[retention]\nenabled = false\ninterval = \"0s\"\nkeep_commits = 1\nkeep_for = \"2d\"\n"
    );
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert!(!c.retention.enabled);
    assert!(c.retention.interval.is_zero());
    assert_eq!(c.retention.keep_commits, 1);
    assert_eq!(c.retention.keep_for, Duration::from_secs(2 * 86_400));
    for (bad, says) in [
        ("keep_commits = 0", "keep_commits must be at least 1"),
        ("keep_for = \"200years\"", "longer than 100 years"),
        ("keep = 3", "keep"),
        ("keep_for = \"soon\"", "keep_for"),
    ] {
        let t = format!("{MIN}[retention]\n{bad}\n");
        let e = Config::from_toml(&t, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains(says), "{bad}: {e}");
    }
}

#[test]
fn partition_sharding_parses_and_refuses_buckets() {
    let t = format!("{MIN}[wal]\nsharding = \"partition\"\n");
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert_eq!(c.wal.sharding, Sharding::Partition);
    assert_eq!(c.wal.partitioner, None);
    let t = format!("{MIN}[wal]\nsharding = \"partition\"\npartitioner = \"murmur2_random\"\n");
    let c = Config::from_toml(&t, Path::new("/")).unwrap();
    assert_eq!(c.wal.partitioner, Some(Partitioner::Murmur2));
    let e = Config::from_toml(
        &format!("{MIN}[wal]\npartitioner = \"fnv1a\"\n"),
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("wal.partitioner is for"), "{e}");
    for bad in [
        format!("{MIN}[wal]\nsharding = \"partition\"\nbuckets = 4\n"),
        format!("{MIN}buckets = 2\n[wal]\nsharding = \"partition\"\n"),
    ] {
        let e = Config::from_toml(&bad, Path::new("/")).unwrap_err();
        assert!(
            e.to_string().contains("partition count") || e.to_string().contains("partitions"),
            "{e}"
        );
    }
    let e = Config::from_toml(
        &format!("{MIN}[wal]\nsharding = \"hash\"\n"),
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("sharding"), "{e}");
}

#[test]
fn two_topics_of_one_type_must_agree_on_buckets() {
    let two = |a: &str, b: &str| {
        format!("{MIN}{a}\n[[mapping]]\ntopic = \"people2\"\nnode = \"Person\"\n{b}")
    };
    // Same count (explicit on one side, the default on the other): fine.
    let c = Config::from_toml(&two("buckets = 4", ""), Path::new("/")).unwrap();
    assert_eq!(c.mappings.len(), 2);
    let e = Config::from_toml(&two("buckets = 8", ""), Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("different buckets (8 and 4)"), "{e}");
    let e = Config::from_toml(&two("", "buckets = 2"), Path::new("/")).unwrap_err();
    assert!(
        e.to_string().contains("feed Person with different buckets"),
        "{e}"
    );
}

#[test]
fn co_partitioned_topics_refuse_an_assignor_that_splits_them() {
    let cfg = |strategy: &str, second: &str, sharding: &str| {
        format!(
            "[graph]\nroot = \"g\"\nschema = \"social.pg\"\n[kafka]\n\"bootstrap.servers\" = \"b\"\n\
             \"group.id\" = \"g\"\n{strategy}\n[wal]\nsharding = \"{sharding}\"\n\
             [[mapping]]\ntopic = \"people\"\nnode = \"Person\"\n\
             [[mapping]]\ntopic = \"people2\"\nnode = \"{second}\"\n"
        )
    };
    let sticky = "\"partition.assignment.strategy\" = \"cooperative-sticky\"";
    let e = Config::from_toml(&cfg(sticky, "Person", "partition"), Path::new("/")).unwrap_err();
    assert!(
        e.to_string()
            .contains("people and people2 both feed Person")
            && e.to_string().contains("only \"range\""),
        "{e}"
    );
    let rr = "\"partition.assignment.strategy\" = \"roundrobin\"";
    assert!(Config::from_toml(&cfg(rr, "Person", "partition"), Path::new("/")).is_err());
    // `range` (set or by default), one topic per type, or bucket
    // sharding: nothing to keep together.
    let range = "\"partition.assignment.strategy\" = \"range\"";
    let uniform = "\"group.protocol\" = \"consumer\"\n\"group.remote.assignor\" = \"uniform\"";
    let e = Config::from_toml(&cfg(uniform, "Person", "partition"), Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("group.remote.assignor"), "{e}");
    let next_gen = "\"group.protocol\" = \"consumer\"";
    for ok in [
        cfg(next_gen, "Person", "partition"),
        cfg(range, "Person", "partition"),
        cfg("", "Person", "partition"),
        cfg(sticky, "Company", "partition"),
        cfg(sticky, "Person", "bucket"),
    ] {
        Config::from_toml(&ok, Path::new("/")).unwrap();
    }
}
