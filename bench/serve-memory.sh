#!/usr/bin/env bash
# serve-memory.sh: the resident memory of a long-running `loom serve` on the memory journal.
#
# Starts the devis example's `serve` (the `loom` CLI with the `prix_ttc` tool, the scripted fake
# model: 17 events per run) on a copy of examples/devis whose journal is `backend: memory`,
# then sends RUNS synchronous runs (`POST /v1/agents/devis/runs`, each its own session, the
# answer checked) from CONCURRENCY keep-alive connections, and prints the resident set size
# (VmRSS, and VmHWM, its peak) of the server: at start (configuration loaded, nothing run), after
# 5,000 runs (or RUNS, if fewer) and after RUNS, with the memory per run between the two, and
# the runs per second. Each run is the whole request: the run driven, its result read back from
# the journal.
#
# Usage (from anywhere; the commands run from the repository root):
#   bench/serve-memory.sh [RUNS=35000] [CONCURRENCY=4]
# LOOM_BENCH_PROFILE=dev uses a debug build (quicker to build, slower to run; the memory is
# the same data); LOOM_BENCH_BIN=<path> uses that devis binary as it is (no build).
# Needs python3 (the HTTP driver). Respects CARGO_TARGET_DIR.
set -euo pipefail

RUNS=${1:-35000}
CONCURRENCY=${2:-4}
case "$RUNS$CONCURRENCY" in
    *[!0-9]*)
        echo "serve-memory.sh: RUNS and CONCURRENCY are whole numbers (usage: serve-memory.sh [RUNS] [CONCURRENCY])" >&2
        exit 2
        ;;
esac
if [ "$RUNS" -lt 1 ] || [ "$CONCURRENCY" -lt 1 ]; then
    echo "serve-memory.sh: RUNS and CONCURRENCY must be at least 1" >&2
    exit 2
fi
MID=$(( RUNS < 5000 ? RUNS : 5000 ))

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if [ -n "${LOOM_BENCH_BIN:-}" ]; then
    bin=$LOOM_BENCH_BIN
else
    profile=${LOOM_BENCH_PROFILE:-release}
    echo "building the devis example ($profile)..." >&2
    cargo build --profile "$profile" --example devis --quiet
    target_dir=$(cargo metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    dir=$profile
    [ "$profile" = dev ] && dir=debug
    bin="$target_dir/$dir/examples/devis"
fi
if [ ! -x "$bin" ]; then
    echo "serve-memory.sh: $bin is not an executable" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/loom-serve-memory.XXXXXX")
server=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

cp -r examples/devis/agents examples/devis/prompts "$work/"
# The same configuration, the journal in memory.
sed -e '/^storage:/,/^$/d' examples/devis/loom.yaml > "$work/loom.yaml"
printf '\nstorage:\n  events:\n    backend: memory\n' >> "$work/loom.yaml"
grep -q 'backend: memory' "$work/loom.yaml" && ! grep -q 'backend: jsonl' "$work/loom.yaml" || {
    echo "serve-memory.sh: examples/devis/loom.yaml changed: cannot set the memory journal" >&2
    exit 1
}

(cd "$work" && exec "$bin" --config loom.yaml --no-env-file serve --port 0) 2>"$work/serve.log" &
server=$!
address=""
for _ in $(seq 1 300); do
    address=$(sed -n 's/.*Listening on http:\/\/\([^ ]*\).*/\1/p' "$work/serve.log" | head -1)
    [ -n "$address" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$address" ]; then
    echo "serve-memory.sh: serve did not start:" >&2
    cat "$work/serve.log" >&2
    exit 1
fi

python3 - "$address" "$server" "$RUNS" "$MID" "$CONCURRENCY" <<'EOF'
import http.client, json, sys, threading, time

address, pid, runs, mid, concurrency = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
host, port = address.rsplit(":", 1)
body = json.dumps({"message": "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?"})

def status():
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields

def report(label, done, elapsed):
    s = status()
    rate = f"{done / elapsed:8.0f} runs/s" if elapsed else " " * 15
    print(f"{label:<16} {done:>7} runs  RSS {s['VmRSS']:8.1f} MiB  peak {s['VmHWM']:8.1f} MiB  {rate}", flush=True)
    return s["VmRSS"]

lock = threading.Lock()
next_run = 0
failures = []

def worker(limit):
    global next_run
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    while True:
        with lock:
            if next_run >= limit or failures:
                return
            next_run += 1
        conn.request("POST", "/v1/agents/devis/runs", body, {"content-type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        if response.status != 201 or b'"completed"' not in answer or "€".encode() not in answer:
            with lock:
                failures.append(f"{response.status} {answer[:300]!r}")
            return

def drive(limit):
    threads = [threading.Thread(target=worker, args=(limit,)) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.exit(f"serve-memory.sh: a run failed: {failures[0]}")

start_rss = report("start", 0, 0)
began = time.monotonic()
drive(mid)
mid_rss = report("after", mid, time.monotonic() - began)
if runs > mid:
    drive(runs)
    end_rss = report("after", runs, time.monotonic() - began)
    per_run = (end_rss - mid_rss) * 1024 * 1024 / (runs - mid)
    print(f"per run, {mid} -> {runs}: {per_run / 1024:.1f} KiB")
else:
    per_run = (mid_rss - start_rss) * 1024 * 1024 / mid
    print(f"per run, 0 -> {mid}: {per_run / 1024:.1f} KiB")
EOF
