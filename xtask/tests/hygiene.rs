//! Test hygiene as a test: `cargo test` fails when test code measures wall-clock time, polls
//! in a hand-written loop that sleeps, gates a test file on a feature, or reads `../shared`
//! without `loom_testkit::shared` (see `xtask::hygiene`).

use xtask::{hygiene, workspace_root};

#[test]
fn test_code_neither_times_nor_hand_polls_nor_reads_shared_directly() {
    let violations = hygiene::check_tests(&workspace_root()).unwrap();
    assert!(
        violations.is_empty(),
        "test hygiene: {} violation(s)\n  {}",
        violations.len(),
        violations.join("\n  ")
    );
}
