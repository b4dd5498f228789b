//! The stock `loom` binary: the CLI with no tools of its own (agents use MCP servers and
//! built-in tools; Rust tools come from a binary that embeds [`loom_cli::App`]).

fn main() -> std::process::ExitCode {
    loom_cli::App::new().main()
}
