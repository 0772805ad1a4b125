//! The graphsink binary as the tests run it. Every process goes through
//! `output` (to its end) or `Running` (a child), and both check what it
//! printed on stderr: no line a user reads (errors, exit lines, logs at
//! INFO and above) may carry a Rust source location (issue 50). A test
//! that spawns the binary any other way loses the check.
//!
//! Runs in process (`graphsink::run_with`) log through the test's own
//! subscriber, not a stderr of their own, so this check cannot see them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::thread::JoinHandle;

/// `graphsink` with no arguments yet, for `output` or `Running::spawn`.
pub(crate) fn graphsink() -> Command {
    Command::new(env!("CARGO_BIN_EXE_graphsink"))
}

/// Runs `cmd` (a `graphsink` command) to its end, then checks its stderr.
pub(crate) fn output(mut cmd: Command) -> Output {
    let out = cmd.output().expect("run graphsink");
    check_stderr(&describe(&cmd), &String::from_utf8_lossy(&out.stderr));
    out
}

/// A `graphsink` child. Its stderr is read as it runs, passed on to the
/// test's, and checked once the child has ended (`wait`, a `try_wait`
/// that sees the end, or the drop, which kills a child still running).
pub(crate) struct Running {
    child: Child,
    what: String,
    reader: Option<JoinHandle<String>>,
    stderr: Option<String>,
    /// What it has printed so far, for a test waiting for a line.
    so_far: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Running {
    /// Spawns `cmd` with its stderr piped to the checker.
    pub(crate) fn spawn(mut cmd: Command) -> Running {
        cmd.stderr(Stdio::piped());
        let what = describe(&cmd);
        let mut child = cmd.spawn().expect("spawn graphsink");
        let pipe = child.stderr.take().expect("piped stderr");
        let so_far = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let seen = so_far.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                let mut all = seen.lock().unwrap_or_else(|e| e.into_inner());
                all.push_str(&line);
                all.push('\n');
            }
            std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()))
        });
        Running {
            child,
            what,
            reader: Some(reader),
            stderr: None,
            so_far,
        }
    }

    /// What the child has printed on stderr so far (it may still run).
    pub(crate) fn printed(&self) -> String {
        match &self.stderr {
            Some(all) => all.clone(),
            None => self
                .so_far
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL; `wait` then reaps it and checks what it printed.
    pub(crate) fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()
    }

    pub(crate) fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait()?;
        self.ended();
        Ok(status)
    }

    pub(crate) fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.ended();
        }
        Ok(status)
    }

    /// What the child printed on stderr; only once it has ended.
    pub(crate) fn stderr(&self) -> &str {
        self.stderr
            .as_deref()
            .expect("the child's stderr is whole once it has ended")
    }

    fn ended(&mut self) {
        if let Some(reader) = self.reader.take() {
            let text = reader.join().expect("stderr reader");
            check_stderr(&self.what, &text);
            self.stderr = Some(text);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.reader.is_none() {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A test already failing says why; a second panic would abort.
        if !std::thread::panicking() {
            self.ended();
        }
    }
}

fn describe(cmd: &Command) -> String {
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!("graphsink {}", args.join(" "))
}

/// Fails the test when a line a user reads shows a Rust source location.
/// DEBUG and TRACE lines keep a library error's full text on purpose.
pub(crate) fn check_stderr(what: &str, stderr: &str) {
    let leaks = source_locations(stderr);
    assert!(
        leaks.is_empty(),
        "{what} printed a Rust source location where a user reads it:\n{}",
        leaks.join("\n")
    );
}

/// The lines of `stderr` below DEBUG that show a source location.
fn source_locations(stderr: &str) -> Vec<&str> {
    static RES: OnceLock<[regex::Regex; 3]> = OnceLock::new();
    let [ansi, location, debug] = RES.get_or_init(|| {
        [
            regex::Regex::new(r"\x1b\[[0-9;]*m").unwrap(),
            regex::Regex::new(r"\.rs:\d+|/src/").unwrap(),
            // A text line's level follows its timestamp; a JSON line names it.
            regex::Regex::new(r#"^\S+\s+(DEBUG|TRACE)\s|"level":"(DEBUG|TRACE)""#).unwrap(),
        ]
    });
    stderr
        .lines()
        .filter(|l| {
            let plain = ansi.replace_all(l, "");
            location.is_match(&plain) && !debug.is_match(&plain)
        })
        .collect()
}

#[test]
fn a_source_location_is_found_outside_debug_lines() {
    let text = "\
2026-01-01T00:00:00.000000Z  INFO graphsink: opening graph
graphsink: error: shard x was fenced: Writer fenced, /root/.cargo/registry/src/i/lance-14.0.2/src/a.rs:1:2
\x1b[2m2026-01-01T00:00:00Z\x1b[0m \x1b[34mDEBUG\x1b[0m graphsink: full text: src/a.rs:1:2
{\"level\":\"DEBUG\",\"error\":\"x.rs:3:4\"}
{\"level\":\"WARN\",\"error\":\"lance/src/io.rs\"}
";
    let found = source_locations(text);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("graphsink: error:"));
    assert!(found[1].contains("WARN"));
}
