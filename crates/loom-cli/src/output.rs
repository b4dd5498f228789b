//! Standard output for commands: `outln!` and `out!` instead of `println!` and `print!`.
//!
//! `println!` panics when stdout is closed (`loom report --json | head -1`). Here a closed
//! stdout (`BrokenPipe`) ends the output quietly, as in any Unix filter, and the command goes
//! on to its real exit code: what it did is journaled whether or not its output was read. Any
//! other write error is reported once on stderr.

use std::{
    fmt,
    io::{self, Write},
    sync::atomic::{AtomicBool, Ordering},
};

/// Set once a write failed: nothing more is written.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` to stdout and flushes it (see the module doc for errors).
pub(crate) fn write(args: fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(error) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        let first = !CLOSED.swap(true, Ordering::Relaxed);
        if first && error.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {error}");
        }
    }
}

/// `print!` that survives a closed stdout.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}

/// `println!` that survives a closed stdout.
macro_rules! outln {
    () => {
        $crate::output::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};
