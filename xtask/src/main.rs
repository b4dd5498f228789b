//! `cargo run -p xtask -- tidy`: runs the repository checks and prints them.

use std::process::ExitCode;

const USAGE: &str = "usage: cargo run -p xtask -- tidy";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["tidy"] => tidy(),
        ["help" | "--help" | "-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn tidy() -> ExitCode {
    let checks = match xtask::run_all(&xtask::workspace_root()) {
        Ok(checks) => checks,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = false;
    for check in &checks {
        if check.violations.is_empty() {
            println!("ok    {}", check.name);
        } else {
            failed = true;
            println!("FAIL  {}", check.name);
            for violation in &check.violations {
                println!("      {violation}");
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
