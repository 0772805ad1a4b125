//! The `graphsink` binary: parses the command line and hands over to the library.

fn main() -> std::process::ExitCode {
    graphsink::cli_main()
}
