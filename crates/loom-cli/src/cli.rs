//! Arguments and commands.
//!
//! Split by what each part decides: `args` what the command line accepts (clap), `dispatch`
//! how a parsed command line is run (loading, signals, logging), `runs` the commands on runs, `replay` exact replay,
//! `exit` the exit code and error line of a command and JSON output.

mod args;
mod dispatch;
mod eval;
mod exit;
mod replay;
mod runs;

pub use args::Cli;
pub(crate) use dispatch::execute;
pub(crate) use exit::print_json;
pub(crate) use runs::user_name;
