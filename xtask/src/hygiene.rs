//! Test hygiene: what makes a test hang, lie or depend on the machine, refused in test code
//! (the files under a crate's `tests/`, and what follows `#[cfg(test)]` in a source file).
//!
//! - **No wall-clock timing**: no `.elapsed()`, no `Instant` `.duration_since(…)`, and no
//!   `Instant::now()` other than `tokio::time::Instant::now()` compared or subtracted on its
//!   line (tests that check what was waited pause tokio's clock). A shared, loaded machine
//!   makes any measured duration a coin toss. An instant taken as a fixed starting point for
//!   logic that receives time as data is fine.
//! - **No hand-written polling loop**: a `loop` or `while` (not `while let`) whose body sleeps
//!   hangs when the awaited thing never happens; `loom_testkit::wait` polls with a deadline and
//!   fails naming what it awaited.
//! - **No test file gated by `#![cfg(feature = …)]`**: it compiles to nothing unless another
//!   crate of the build happens to enable the feature; declare `required-features` on its
//!   `[[test]]` instead.
//! - **`../shared` only through `loom_testkit::shared`**, which skips the test on a clone
//!   without it (and fails it when `LOOM_REQUIRE_SERVICES=1`).

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::workspace::Error;

/// The one file allowed to name `../shared` in code.
const SHARED_HELPER: &str = "crates/loom-testkit/src/shared.rs";

/// Every violation in the test code of the crates under `root/crates`, as `file:line: rule`,
/// sorted.
pub fn check_tests(root: &Path) -> Result<Vec<String>, Error> {
    let mut files = Vec::new();
    collect_rust_files(&root.join("crates"), &mut files)?;
    collect_rust_files(&root.join("xtask/tests"), &mut files)?;
    let mut violations = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let source = fs::read_to_string(&file)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", file.display())))?;
        violations.extend(check_file(&relative, &source));
    }
    violations.sort();
    Ok(violations)
}

/// The violations of one file, `relative` to the workspace root.
pub fn check_file(relative: &str, source: &str) -> Vec<String> {
    let in_tests_dir = relative.contains("/tests/") || relative.starts_with("tests/");
    let lines: Vec<&str> = source.lines().collect();
    let first_test_line = if in_tests_dir {
        Some(0)
    } else {
        lines
            .iter()
            .position(|line| line.trim_start().starts_with("#[cfg(test)]"))
    };
    let Some(first) = first_test_line else {
        return Vec::new();
    };
    let mut violations = Vec::new();
    let mut report = |index: usize, rule: &str| {
        violations.push(format!("{relative}:{}: {rule}", index + 1));
    };
    if in_tests_dir
        && let Some(index) = lines
            .iter()
            .position(|line| line.trim_start().starts_with("#![cfg(feature"))
    {
        report(
            index,
            "a test file gated by #![cfg(feature = ...)]: declare required-features on its \
             [[test]] instead",
        );
    }
    for (index, line) in lines.iter().enumerate().skip(first) {
        let code = code_of(line);
        let since_an_instant = code.contains(".duration_since(") && code.contains("Instant");
        if code.contains(".elapsed()") || since_an_instant || wall_clock_now(code) {
            report(
                index,
                "wall-clock timing in a test: assert on outcomes, or pause tokio's clock",
            );
        }
        if names_shared(code) && relative != SHARED_HELPER {
            report(
                index,
                "../shared read directly: use loom_testkit::shared (skips on a bare clone)",
            );
        }
        if starts_a_polling_loop(code) && block_sleeps(&lines[index..]) {
            report(
                index,
                "a polling loop that sleeps: use loom_testkit::wait (a deadline and a message)",
            );
        }
    }
    violations
}

/// The line without a `//` comment (a rough cut: `//` inside a string ends it too).
fn code_of(line: &str) -> &str {
    match line.find("//") {
        Some(at) => &line[..at],
        None => line,
    }
}

/// `Instant::now()` other than tokio's, compared or subtracted on the same line (a measure or
/// a hand-written deadline).
fn wall_clock_now(code: &str) -> bool {
    let measured = [" < ", " > ", " <= ", " >= ", " - "]
        .iter()
        .any(|operator| code.contains(operator));
    measured
        && code
            .match_indices("Instant::now()")
            .any(|(at, _)| !code[..at].ends_with("tokio::time::"))
}

/// A string literal naming `../shared`.
fn names_shared(code: &str) -> bool {
    code.split('"')
        .skip(1)
        .step_by(2)
        .any(|literal| literal.contains("../shared") || literal.contains("/shared/"))
}

/// A `loop {` or a `while` that is not a `while let`.
fn starts_a_polling_loop(code: &str) -> bool {
    let trimmed = code.trim_start();
    let is_while = trimmed.starts_with("while ") && !trimmed.starts_with("while let ");
    let is_loop = trimmed.starts_with("loop {")
        || code.contains("= loop {")
        || code.contains("=> loop {")
        || code.contains("(loop {");
    is_while || is_loop
}

/// Whether the block opened at the first line of `lines` calls a `sleep(` before it closes.
fn block_sleeps(lines: &[&str]) -> bool {
    let mut depth = 0usize;
    let mut opened = false;
    for line in lines {
        let code = code_of(line);
        if opened && code.contains("sleep(") {
            return true;
        }
        for c in code.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if opened && depth == 0 {
            return false;
        }
    }
    false
}

fn collect_rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    if !dir.is_dir() {
        return Ok(());
    }
    let entries =
        fs::read_dir(dir).map_err(|e| Error::new(format!("cannot list {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::new(format!("cannot list {}: {e}", dir.display())))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') && name != "benches" {
                collect_rust_files(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_assertions_are_refused_but_tokio_paused_time_is_not() {
        let source = "fn t() {\n    let s = std::time::Instant::now();\n    \
                      assert!(s.elapsed() < D);\n    while Instant::now() < deadline {}\n    \
                      let w = tokio::time::Instant::now() - v;\n}\n";
        assert_eq!(
            check_file("crates/a/tests/t.rs", source),
            [
                "crates/a/tests/t.rs:3: wall-clock timing in a test: assert on outcomes, or \
                 pause tokio's clock",
                "crates/a/tests/t.rs:4: wall-clock timing in a test: assert on outcomes, or \
                 pause tokio's clock"
            ]
        );
    }

    #[test]
    fn only_test_code_of_a_source_file_is_checked() {
        let source = "fn lib() { let t = s.elapsed(); }\n#[cfg(test)]\nmod tests {\n    \
                      fn t() { s.elapsed(); }\n}\n";
        let violations = check_file("crates/a/src/lib.rs", source);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("crates/a/src/lib.rs:4:"));
        assert!(check_file("crates/a/src/other.rs", "fn f() { s.elapsed(); }\n").is_empty());
    }

    #[test]
    fn polling_loops_that_sleep_are_refused() {
        let source = "async fn t() {\n    while !done()\n        .await\n    {\n        \
                      tokio::time::sleep(D).await;\n    }\n    let r = loop {\n        \
                      if x { break 1; }\n        std::thread::sleep(D);\n    };\n    \
                      while let Some(f) = s.next().await {\n        sleep(D).await;\n    }\n    \
                      loop {\n        if y { break; }\n    }\n    sleep(D).await;\n}\n";
        let violations = check_file("crates/a/tests/t.rs", source);
        assert_eq!(
            violations,
            [
                "crates/a/tests/t.rs:2: a polling loop that sleeps: use loom_testkit::wait (a \
                 deadline and a message)",
                "crates/a/tests/t.rs:7: a polling loop that sleeps: use loom_testkit::wait (a \
                 deadline and a message)"
            ]
        );
    }

    #[test]
    fn feature_gated_test_files_and_direct_shared_reads_are_refused() {
        let source = "//! Reads `../shared/fixtures`.\n#![cfg(feature = \"x\")]\nfn d() -> P \
                      {\n    root.join(\"../../../shared/fixtures/providers\")\n}\n";
        let violations = check_file("crates/a/tests/t.rs", source);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains(":2: a test file gated by #![cfg(feature"));
        assert!(violations[1].contains(":4: ../shared read directly"));
        assert!(
            check_file(
                SHARED_HELPER,
                "#[cfg(test)]\nmod t {\n    fn f() { \"../shared not found\"; }\n}\n"
            )
            .is_empty()
        );
    }
}
