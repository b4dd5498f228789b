#!/usr/bin/env bash
# long-session.sh: the cost of one more `loom run --session` in a long session, against a run
# in a fresh session, through the CLI (the devis example, release build), on JSONL and SQLite.
#
# For each journal (JSONL, SQLite) and each configuration (`plain`: the example as it is, whose
# history grows with every run; `compaction`: with `sessions.compaction` on a scripted fake
# summarizer, `over_tokens: 4000`, `keep_last: 6`), a session is grown to at least EVENTS events
# (default 10,000) by running the devis agent in it again and again (17 events per run, plus
# the session's snapshots and compactions), each run a new process as a user's would be. Then
# hyperfine times, in new processes:
#   fresh   `run devis <message>`                 (a new session each time)
#   long    `run devis <message> --session long`  (one more run in the long session), from each
#           of the states the session goes through in its next LOOM_BENCH_STATES runs (default
#           10, about one compaction cycle), the journal put back before each timed run
# and the script prints the journal's size, each state's median and their mean. What a run reads of a long session is the last
# `session.snapshot` and the events after it (README, "Long sessions").
#
# Usage (from anywhere):
#   bench/long-session.sh [EVENTS] [RUNS]     RUNS timed invocations per command (default 20)
# LOOM_BENCH_BIN=/path/to/devis times that binary instead of building it.
# LOOM_BENCH_BACKENDS="jsonl sqlite" and LOOM_BENCH_MODES="plain compaction" (the defaults)
# choose what is measured. LOOM_BENCH_WORK=<dir> keeps the grown sessions there (not removed
# at exit) and reuses them when run again: only the timing is done again (to time another
# binary, or the same one on a quieter machine, on the same journals).
# Needs hyperfine (and sqlite3 for the SQLite rows). Respects CARGO_TARGET_DIR.
set -euo pipefail

events=${1:-10000}
runs=${2:-20}
case "$events$runs" in
    *[!0-9]*)
        echo "long-session.sh: usage: long-session.sh [EVENTS] [RUNS]" >&2
        exit 2
        ;;
esac
command -v hyperfine >/dev/null || {
    echo "long-session.sh: hyperfine is needed (apt-get install hyperfine)" >&2
    exit 2
}

message="Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?"
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
if [ -n "${LOOM_BENCH_BIN:-}" ]; then
    bin=$LOOM_BENCH_BIN
else
    echo "building the devis example (release)..." >&2
    cargo build --release -p loom-cli --example devis --quiet
    target_dir=$(cargo metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    bin="$target_dir/release/examples/devis"
fi

if [ -n "${LOOM_BENCH_WORK:-}" ]; then
    work=$LOOM_BENCH_WORK
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/loom-long-session.XXXXXX")
    trap 'rm -rf "$work"' EXIT
fi
echo "machine: $(nproc) CPU(s), $(uname -sr)"
echo

for backend in ${LOOM_BENCH_BACKENDS:-jsonl sqlite}; do
for mode in ${LOOM_BENCH_MODES:-plain compaction}; do
    dir="$work/$backend-$mode"
    reuse=false
    [ -f "$dir/loom.yaml" ] && reuse=true
    mkdir -p "$dir"
    $reuse || cp -R examples/devis/loom.yaml examples/devis/agents examples/devis/prompts "$dir/"
    if ! $reuse && [ "$backend" = sqlite ]; then
        sed -i 's|backend: jsonl|backend: sqlite|; s|path: data .*|path: data/loom.db|' "$dir/loom.yaml"
    fi
    if ! $reuse && [ "$mode" = compaction ]; then
        # The summary keeps the amounts of the turns it replaces (the fidelity check wants them).
        python3 - "$dir/loom.yaml" <<'PY'
import sys
path = sys.argv[1]
summarizer = """  - id: resumeur
    sdk: fake
    model: SUM
    params:
      script:
        - text: "Le client a demandé plusieurs fois le prix TTC d'un devis de rénovation de 1 250 € HT (TVA à 10 %) : 1 375 € TTC, soit 125 € de TVA."
"""
text = open(path).read().replace("models:\n", "models:\n" + summarizer, 1)
text += "\nsessions:\n  compaction: {model: resumeur, over_tokens: 4000, keep_last: 6}\n"
open(path, "w").write(text)
PY
    fi
    cfg=(--config "$dir/loom.yaml")
    count() {
        if [ "$backend" = jsonl ]; then
            wc -l <"$dir/data/default/long.jsonl"
        else
            sqlite3 "$dir/data/loom.db" "select count(*) from events where session_id = 'long'"
        fi
    }
    start=$EPOCHREALTIME
    $reuse || "$bin" "${cfg[@]}" run devis "$message" --session long >/dev/null
    while [ "$(count)" -lt "$events" ]; do
        "$bin" "${cfg[@]}" run devis "$message" --session long >/dev/null
    done
    grown=$(count)
    echo "== $backend, $mode: session 'long' grown to $grown events in $(echo "$EPOCHREALTIME - $start" | bc) s"
    if [ "$backend" = jsonl ]; then
        echo "   file: $(du -h "$dir/data/default/long.jsonl" | cut -f1)," \
            "$(grep -c '"type":"session.snapshot"' "$dir/data/default/long.jsonl") snapshots," \
            "$(grep -c '"type":"session.compacted"' "$dir/data/default/long.jsonl") compactions"
    else
        echo "   database: $(du -h "$dir/data/loom.db" | cut -f1)"
    fi
    # The states before the next STATES runs (a compaction cycle is about ten runs), each
    # timed from itself: the prepare step puts the journal back as it was (JSONL: the session
    # file, its index and the run index copied over the files, which keep their inodes, so the
    # index stays valid; SQLite: a copy of the database, WAL and all).
    states=${LOOM_BENCH_STATES:-10}
    saved="$dir/states"
    rm -rf "$saved"
    mkdir -p "$saved"
    journal="$dir/data/default"
    for k in $(seq 1 "$states"); do
        if [ "$backend" = jsonl ]; then
            mkdir -p "$saved/$k"
            cp "$journal/long.jsonl" "$journal/long.jsonl.idx" "$journal/.runs" "$saved/$k/"
        else
            cp -R "$dir/data" "$saved/$k"
        fi
        "$bin" "${cfg[@]}" run devis "$message" --session long >/dev/null
    done
    for k in $(seq 1 "$states"); do # the prepare step that puts state $k back
        if [ "$backend" = jsonl ]; then
            # Copied over the files, which keep their inodes (the index names its file's).
            echo "for f in long.jsonl long.jsonl.idx .runs; do cp '$saved/$k/'\$f '$journal/'\$f; done"
        else
            echo "rm -rf '$dir/data' && cp -R '$saved/$k' '$dir/data'"
        fi >"$saved/restore-$k.sh"
        # Written back before the timed run, not during it.
        echo sync >>"$saved/restore-$k.sh"
    done
    timed=(--command-name "$backend $mode fresh" --prepare true "$bin --config $dir/loom.yaml run devis 'Un devis ?'")
    for k in $(seq 1 "$states"); do
        timed+=(--command-name "$backend $mode long $k" --prepare "bash $saved/restore-$k.sh"
            "$bin --config $dir/loom.yaml run devis 'Un devis ?' --session long")
    done
    hyperfine -N --runs "$runs" --warmup 1 --time-unit millisecond \
        --export-json "$work/$backend-$mode.json" "${timed[@]}" >/dev/null
    python3 - "$work/$backend-$mode.json" <<'PY'
import json, statistics, sys
results = json.load(open(sys.argv[1]))["results"]
fresh, longs = results[0], results[1:]
ms = lambda seconds: seconds * 1000
print("   fresh: median %.1f ms, mean %.1f ms (user %.1f, system %.1f)" % (
    ms(fresh["median"]), ms(fresh["mean"]), ms(fresh["user"]), ms(fresh["system"])))
print("   one more run, from each of %d states: medians %s ms" % (
    len(longs), " ".join("%.1f" % ms(r["median"]) for r in longs)))
mean = statistics.mean(ms(r["median"]) for r in longs)
print("   one more run: mean of the medians %.1f ms, mean %.1f ms (user %.1f, system %.1f); %.2fx fresh" % (
    mean, statistics.mean(ms(r["mean"]) for r in longs),
    statistics.mean(ms(r["user"]) for r in longs), statistics.mean(ms(r["system"]) for r in longs),
    mean / ms(fresh["median"])))
PY
    echo
done
done
