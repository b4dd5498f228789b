#!/usr/bin/env bash
# notes.sh: loom-notes ingest throughput and search latency, release build.
#
# For each corpus size (1,000 and 10,000 chunks by default) a deterministic corpus is generated
# (seeded pseudo-random English-like words from a 2,000-word vocabulary; one document of about
# 900 characters per chunk, so each document is exactly one chunk) as an export file, then:
#   - ingest: `loom-notes import` of that file into an empty data directory (chunking, embedding
#     and writing every chunk, one process), timed from outside: chunks/s;
#   - search: one `loom-notes serve` (stdio) process driven by the official Python MCP SDK,
#     N searches of 3 words drawn from the vocabulary (after 5 untimed warm-up searches), each
#     timed round trip (JSON-RPC over stdio included): p50 and p99 in ms.
#
# Usage (from anywhere; paths are relative to the repository root):
#   bench/notes.sh [SIZES...]              default: 1000 10000
#   SEARCHES=200 bench/notes.sh 1000       searches per size (default 200)
# Models: --fake by default. With REAL_MODEL_DIR=/path/to/model (and the binary built with
# `--features candle`, set FEATURES=candle), the dense model is read from that directory
# (LOOM_NOTES_MODEL_DIR) instead. LOOM_NOTES_BIN=/path/to/loom-notes skips the build and
# times that binary. Needs python3 with `mcp` (pip install mcp). Respects
# CARGO_TARGET_DIR.
set -euo pipefail

sizes=("$@")
if [ ${#sizes[@]} -eq 0 ]; then
    sizes=(1000 10000)
fi
for size in "${sizes[@]}"; do
    case "$size" in
        '' | *[!0-9]*)
            echo "notes.sh: a size must be a number of chunks, not '$size'" >&2
            exit 2
            ;;
    esac
done
searches=${SEARCHES:-200}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if [ -n "${LOOM_NOTES_BIN:-}" ]; then
    bin=$LOOM_NOTES_BIN
else
    echo "building loom-notes (release)..." >&2
    features=()
    if [ -n "${FEATURES:-}" ]; then
        features=(--features "$FEATURES")
    fi
    cargo build --release -p loom-notes "${features[@]}" --quiet
    target_dir=${CARGO_TARGET_DIR:-$repo/target}
    bin="$target_dir/release/loom-notes"
fi

model_args=(--fake)
model_label=fake
if [ -n "${REAL_MODEL_DIR:-}" ]; then
    model_args=()
    model_label="real ($(basename "$REAL_MODEL_DIR"))"
    export LOOM_NOTES_MODEL_DIR="$REAL_MODEL_DIR"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$bin" "$work" "$searches" "$model_label" "${sizes[@]}" -- "${model_args[@]}" <<'PY'
import asyncio, hashlib, json, os, random, re, statistics, subprocess, sys, time, unicodedata, uuid

bin_path, work, searches, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rest = sys.argv[5:]
split = rest.index("--")
sizes, model_args = [int(s) for s in rest[:split]], rest[split + 1:]

rng = random.Random(20261206)
syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "fe", "ri", "an", "el"]
vocab = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(3000)})[:2000]

def content_hash(text):
    flat = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()
    return hashlib.sha256(flat.encode()).hexdigest()

def corpus(n, path):
    gen = random.Random(n)
    with open(path, "w") as out:
        for i in range(n):
            words = []
            while sum(len(w) + 1 for w in words) < 900:
                words.append(gen.choice(vocab))
            text = " ".join(words) + "."
            doc = {"doc_id": str(uuid.UUID(int=gen.getrandbits(128), version=4)), "title": f"Doc {i}",
                   "project": f"p{i % 10}", "tags": [], "source_kind": "text", "source": None,
                   "added_at": "2026-12-06T00:00:00.000001+00:00", "updated_at": None,
                   "content_hash": content_hash(text), "text": text}
            out.write(json.dumps(doc) + "\n")

async def search_latencies(data_dir, n):
    from mcp import Client, StdioServerParameters
    params = StdioServerParameters(command=bin_path, args=[*model_args, "--data-dir", data_dir, "serve"],
                                   env={**{k: v for k, v in os.environ.items() if k.startswith("LOOM_NOTES_") or k in ("HOME", "PATH")},
                                        "RUST_LOG": "warn"})
    gen = random.Random(7)
    times = []
    async with Client(params) as client:
        for i in range(n + 5):
            query = " ".join(gen.choice(vocab) for _ in range(3))
            start = time.perf_counter()
            result = await client.call_tool("search", {"query": query, "k": 5})
            elapsed = time.perf_counter() - start
            if result.is_error:
                raise SystemExit(f"search failed: {result.content}")
            if i >= 5:
                times.append(elapsed * 1000)
    return times

rows = []
for size in sizes:
    data_dir = os.path.join(work, f"data-{size}")
    export = os.path.join(work, f"corpus-{size}.jsonl")
    corpus(size, export)
    start = time.perf_counter()
    done = subprocess.run([bin_path, *model_args, "--data-dir", data_dir, "import", export],
                          capture_output=True, text=True)
    ingest = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"import failed: {done.stderr}")
    import sqlite3
    with sqlite3.connect(os.path.join(data_dir, "notes.sqlite")) as db:
        chunks = db.execute("SELECT count(*) FROM chunks").fetchone()[0]
    if chunks != size:
        raise SystemExit(f"expected {size} chunks, the store holds {chunks}")
    times = sorted(asyncio.run(search_latencies(data_dir, searches)))
    p50 = statistics.median(times)
    p99 = times[min(len(times) - 1, int(round(0.99 * len(times))) - 1)]
    rows.append((size, ingest, size / ingest, p50, p99))

print(f"loom-notes, models: {label}, {searches} searches per size (k=5)")
print(f"{'chunks':>8}  {'ingest s':>9}  {'chunks/s':>9}  {'search p50 ms':>13}  {'search p99 ms':>13}")
for size, ingest, rate, p50, p99 in rows:
    print(f"{size:>8}  {ingest:>9.2f}  {rate:>9.0f}  {p50:>13.2f}  {p99:>13.2f}")
PY
