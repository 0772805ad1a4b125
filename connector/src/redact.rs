//! Secrets kept out of logs and errors: which librdkafka properties and
//! `${VAR}` names hold one, and a process-wide list of the secret values
//! the config loaded, masked in every log line (`Writer`) and in printed
//! errors (`text`). The list is process-wide on purpose: logs and stderr
//! are too, and a secret must stay hidden whichever connector logs it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::RwLock;

pub(crate) const MASK: &str = "<redacted>";

/// Shorter values are not masked in free text: masking a 1–3 character
/// string everywhere would garble every line and hide nothing.
const MIN_LEN: usize = 4;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Whether a librdkafka property (or any settings key) holds a secret:
/// `sasl.password`, `ssl.key.password`, `ssl.key.pem`,
/// `ssl.keystore.password`, OAuth client secrets and config, and any key
/// naming a password, secret, token or credential.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["password", "secret", "token", "credential"]
        .iter()
        .any(|w| k.contains(w))
        || matches!(
            k.as_str(),
            "ssl.key.pem" | "ssl_key" | "sasl.oauthbearer.config" | "sasl.jaas.config"
        )
}

/// Whether a `${VAR}` name says its value is a secret.
pub(crate) fn is_secret_var(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    ["SECRET", "PASSWORD", "TOKEN", "KEY"]
        .iter()
        .any(|w| n.contains(w))
}

/// Masks `value` wherever it appears in logs and printed errors from now on.
pub(crate) fn register(value: &str) {
    if value.len() < MIN_LEN {
        return;
    }
    // JSON logs escape `"`, `\` and control characters: mask that form too.
    let escaped = serde_json::to_string(value).unwrap_or_default();
    let escaped = escaped.trim_matches('"');
    let mut all = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    for v in [value, escaped] {
        if !all.iter().any(|s| s == v) {
            all.push(v.to_string());
        }
    }
    // Longest first, so a secret containing another is masked whole.
    all.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `s` with every registered secret masked.
pub(crate) fn text(s: &str) -> Cow<'_, str> {
    let all = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    if !all.iter().any(|x| s.contains(x.as_str())) {
        return Cow::Borrowed(s);
    }
    let mut out = s.to_string();
    for x in all.iter() {
        out = out.replace(x.as_str(), MASK);
    }
    Cow::Owned(out)
}

/// Properties with the values of secret keys masked (for `Debug`).
pub(crate) fn props(map: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    map.iter()
        .map(|(k, v)| {
            let v = if is_secret_key(k) { MASK } else { v.as_str() };
            (k.as_str(), v)
        })
        .collect()
}

/// A log writer that masks registered secrets in what it writes. The fmt
/// layers write one event per `write`, so a secret is never split.
pub(crate) struct Writer<W>(pub W);

impl<W: Write> Write for Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(s) => match text(s) {
                Cow::Borrowed(_) => self.0.write_all(buf),
                Cow::Owned(masked) => self.0.write_all(masked.as_bytes()),
            },
            Err(_) => self.0.write_all(buf),
        }?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// `make_writer` for tracing-subscriber: stderr, masked.
pub(crate) fn stderr() -> Writer<std::io::Stderr> {
    Writer(std::io::stderr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_and_vars() {
        for k in [
            "sasl.password",
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "aws_secret_access_key",
            "aws_session_token",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["bootstrap.servers", "sasl.username", "ssl.ca.location"] {
            assert!(!is_secret_key(k), "{k}");
        }
        assert!(is_secret_var("KAFKA_PASSWORD") && is_secret_var("aws_secret_key"));
        assert!(!is_secret_var("BROKER"));
    }

    #[test]
    fn registered_values_are_masked_in_text_and_writes() {
        register("unit-secret-9f3a");
        register("abc"); // too short to mask
        assert_eq!(text("x unit-secret-9f3a y abc"), "x <redacted> y abc");
        let mut w = Writer(Vec::new());
        w.write_all(b"{\"v\":\"unit-secret-9f3a\"}").unwrap();
        assert_eq!(String::from_utf8(w.0).unwrap(), "{\"v\":\"<redacted>\"}");
        // As a JSON log line escapes it.
        register("quote\"d-secret");
        assert_eq!(
            text("{\"v\":\"quote\\\"d-secret\"}"),
            "{\"v\":\"<redacted>\"}"
        );
    }
}
