//! Reading the file: `${VAR}` expansion, the root's URI, a section read
//! before the config is loaded.

use super::*;

/// The text of a config file and the directory its relative paths
/// resolve against.
pub(super) fn read_file(path: &Path) -> Result<(String, PathBuf)> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::config(format!("cannot read {}: {e}", path.display())))?;
    let base_dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    Ok((text, base_dir))
}
/// One section of a config file, read before the config itself is loaded
/// (for what start-up needs first); `None` when it cannot be read.
pub(super) fn early_section(path: &Path, name: &str) -> Option<toml::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut value: toml::Table = toml::from_str(&text).ok()?;
    value.remove(name)
}
pub(crate) fn resolve_uri(root: &str, base_dir: &Path) -> String {
    if root.contains("://") {
        return root.trim_end_matches('/').to_string();
    }
    let p = Path::new(root);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        let base = if base_dir.is_absolute() {
            base_dir.to_path_buf()
        } else {
            std::env::current_dir()
                .unwrap_or_else(|_| PathBuf::from("/"))
                .join(base_dir)
        };
        base.join(p)
    };
    normalize(&abs)
        .to_string_lossy()
        .trim_end_matches('/')
        .to_string()
}
/// One spelling of a graph root, for what must name the graph rather than
/// the config's way of writing it (the fold-reject producer's
/// `transactional.id`): a local path without `file://`, `.` and `..`
/// resolved, no trailing `/`. `uri` is a root as `resolve_uri` gives it
/// (relative paths already made absolute).
pub(crate) fn canonical_root(uri: &str) -> String {
    let (scheme, path) = match uri.split_once("://") {
        Some(("file", path)) => ("", path),
        Some((scheme, path)) => (scheme, path),
        None => ("", uri),
    };
    let path = normalize(Path::new(path)).to_string_lossy().into_owned();
    let path = path.trim_end_matches('/');
    if scheme.is_empty() {
        path.to_string()
    } else {
        format!("{scheme}://{path}")
    }
}
/// Lexical `.`/`..` removal, so URIs stay stable without touching the disk.
pub(super) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}
/// Replaces `${NAME}` in every string value; a missing variable is an error
/// naming the field, so secrets never silently become empty strings.
pub(super) fn expand_env(value: &mut toml::Value, path: &str) -> Result<()> {
    match value {
        toml::Value::String(s) if s.contains("${") => *s = expand_str(s, path)?,
        toml::Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                expand_env(v, &format!("{path}[{i}]"))?;
            }
        }
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                expand_env(v, &p)?;
            }
        }
        _ => {}
    }
    Ok(())
}
pub(super) fn expand_str(s: &str, field: &str) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| Error::config(format!("{field}: unterminated ${{ in {s:?}")))?;
        let name = &after[..end];
        let val = std::env::var(name).map_err(|_| {
            Error::config(format!("{field}: environment variable {name} is not set"))
        })?;
        if redact::is_secret_var(name) {
            redact::register(&val);
        }
        out.push_str(&val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
