//! Progress bars for the long commands (import, reindex, eval), drawn only on a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on stderr, hidden when stderr is not a terminal.
#[derive(Debug)]
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar labelled `what` (`import`, `reindex`, `eval`).
    pub(crate) fn new(what: &str) -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(0);
            let style = ProgressStyle::with_template("{msg:8} [{bar:40}] {pos}/{len} ({eta})")
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_message(what.to_owned());
            bar
        } else {
            ProgressBar::hidden()
        };
        Self { bar }
    }

    /// Records that `done` of `total` items are done.
    pub(crate) fn update(&self, done: usize, total: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
    }

    /// Removes the bar.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
