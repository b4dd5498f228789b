#!/usr/bin/env bash
# The long chaos run: N trials (default 1000) of a run killed with SIGKILL at random points and
# resumed until it completes; every trial must end with the run completed and exactly one line
# written by its irreversible, idempotent tool. Prints the trials, kills, duplicates and lost
# runs. Usage: bench/chaos.sh [TRIALS] (CHAOS_SEED=<n> replays a sequence).
set -euo pipefail
cd "$(dirname "$0")/.."
export CHAOS_TRIALS="${1:-1000}"
# `cargo test --test chaos` builds the `loom` binary but not the example it drives.
cargo build --release --quiet -p loom-cli --example chaos
cargo test --release -p loom-cli --test chaos -- --nocapture 2>&1 | grep -E '^chaos:|test result|panicked'
