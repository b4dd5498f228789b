#!/usr/bin/env bash
# cold-run.sh: wall time of cold invocations of the devis example (the `loom` CLI with one
# Rust tool), release build.
#
# Each timed invocation is a new process doing everything a user's `loom run` does: parse the
# arguments, start the tokio runtime, load and validate loom.yaml (+ agents/, prompts/), open the
# JSONL journal, drive the devis agent to completion (scripted fake model, one prix_ttc tool
# call, 17 events in 12 synced appends), print the answer, exit. `validate` is timed too (load,
# check and resolve everything, no run, no journal write).
#
# "Cold" means a new process each time; the binary and the files are in the page cache (one
# untimed warm-up invocation first). The runs use a temporary copy of examples/devis, so their
# journals go to a temporary directory that is removed at exit; with --in-place they use
# examples/devis/loom.yaml itself and its journal directory examples/devis/data/ (git-ignored).
#
# Usage (from anywhere; the commands run from the repository root):
#   bench/cold-run.sh [--in-place] [N]        N timed invocations per command (default 10)
# Uses hyperfine when it is installed (unless NO_HYPERFINE is set), else a bash loop (wall time
# from $EPOCHREALTIME, CPU time of the children from `times`). Respects CARGO_TARGET_DIR.
set -euo pipefail

in_place=0
runs=10
for arg in "$@"; do
    case "$arg" in
        --in-place) in_place=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *[!0-9]* | '')
            echo "cold-run.sh: unexpected argument '$arg' (usage: cold-run.sh [--in-place] [N])" >&2
            exit 2
            ;;
        *) runs=$arg ;;
    esac
done
if [ "$runs" -lt 1 ]; then
    echo "cold-run.sh: N must be at least 1" >&2
    exit 2
fi

message="Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?"

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

echo "building the devis example (release)..." >&2
cargo build --release --example devis --quiet
target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/release/examples/devis"
if [ ! -x "$bin" ]; then
    echo "cold-run.sh: $bin was not built" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/loom-cold-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
config=()
if [ "$in_place" -eq 0 ]; then
    cp -R examples/devis/loom.yaml examples/devis/agents examples/devis/prompts "$work/"
    config=(--config "$work/loom.yaml")
    journal="$work/data"
else
    journal="examples/devis/data"
fi

echo "binary:  $bin ($(du -h "$bin" | cut -f1))"
echo "journal: $journal (jsonl)"
echo "machine: $(nproc) CPU(s), $(uname -sr)"
echo "runs:    $runs per command, after 1 warm-up"
echo

# Sets NOW to the microseconds since the epoch ($EPOCHREALTIME, bash 5, costs no process and
# no subshell; else `date`).
now_us() {
    if [ -n "${EPOCHREALTIME:-}" ]; then
        NOW=${EPOCHREALTIME/[.,]/}
    else
        NOW=$(($(date +%s%N) / 1000))
    fi
}

# The arguments as one command line, each single-quoted (read by hyperfine -N).
quoted() {
    local arg out=""
    for arg in "$@"; do
        out+="'${arg//\'/\'\\\'\'}' "
    done
    echo "${out% }"
}

# Total user + system CPU seconds of the finished children, from the `times` builtin (run in
# this shell, not in a subshell, whose children would be others).
children_cpu() {
    times >"$work/times"
    sed -n 2p "$work/times" | awk '{
        total = 0
        for (i = 1; i <= 2; i++) {
            split($i, p, "m"); sub("s", "", p[2]); total += p[1] * 60 + p[2]
        }
        printf "%.3f\n", total
    }'
}

# time_it LABEL COMMAND...: N timed invocations, output discarded (a failure stops the script).
time_it() {
    local label=$1
    shift
    # Warm-up; its output is shown if the command fails.
    if ! "$@" >"$work/warm-up.log" 2>&1; then
        cat "$work/warm-up.log" >&2
        echo "cold-run.sh: '$label' failed" >&2
        exit 1
    fi
    if [ -z "${NO_HYPERFINE:-}" ] && command -v hyperfine >/dev/null 2>&1; then
        hyperfine --runs "$runs" --warmup 1 -N --time-unit millisecond \
            --command-name "$label" -- "$(quoted "$@")"
        echo
        return
    fi
    local samples=() i t0 t1 cpu0 cpu1
    children_cpu >"$work/cpu0"
    for ((i = 0; i < runs; i++)); do
        now_us
        t0=$NOW
        "$@" >/dev/null 2>&1
        now_us
        t1=$NOW
        samples+=($((t1 - t0)))
    done
    children_cpu >"$work/cpu1"
    cpu0=$(cat "$work/cpu0")
    cpu1=$(cat "$work/cpu1")
    printf '%s\n' "${samples[@]}" | awk -v label="$label" -v n="$runs" \
        -v cpu="$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')" '
        NR == 1 { min = $1; max = $1 }
        { sum += $1; if ($1 < min) min = $1; if ($1 > max) max = $1 }
        END {
            printf "%-9s wall min %7.1f ms   mean %7.1f ms   max %7.1f ms   (%d runs)\n",
                label, min / 1000, sum / n / 1000, max / 1000, n
            printf "%-9s cpu (user+sys) %.1f ms per invocation\n",
                "", cpu * 1000 / n
        }'
}

time_it "validate" "$bin" "${config[@]}" validate
time_it "run" "$bin" "${config[@]}" run devis "$message"

# A last look at what a run prints, to show it did the work.
echo
"$bin" "${config[@]}" run devis "$message"
