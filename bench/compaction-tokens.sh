#!/usr/bin/env bash
# compaction-tokens.sh: input tokens sent per run in a long session, without and with
# compaction (`sessions.compaction`), through the `loom` binary.
#
# One session of TURNS runs (default 200) of an agent on the echo fake model, each a new `loom
# run --session long --json` process on a JSONL journal; the fake model estimates its input
# tokens as the reference does (len(request JSON) / 4). The second project compacts with
# over_tokens 2000 and keep_last 6, its summarizer a scripted fake model (a fixed summary; the
# messages hold no amount, date or reference, so the fidelity check passes). Prints, per
# project, the input tokens of the last run, the mean per run, the total, and for the compacting
# one the number of compactions and the input tokens they cost.
#
# Usage: bench/compaction-tokens.sh [TURNS]   (debug build of `loom`; respects CARGO_TARGET_DIR)
set -euo pipefail

turns=${1:-200}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
cargo build -q -p loom-cli --bin loom --manifest-path "$root/Cargo.toml"
bin=$target/debug/loom
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for project in plain compacting; do
    mkdir -p "$work/$project"
    cat > "$work/$project/loom.yaml" <<'YAML'
version: 1
models:
  - {id: main, sdk: fake, model: MAIN}
  - {id: summarizer, sdk: fake, model: SUM, params: {script: [{text: "The user sent lettered messages about a quote; the assistant echoed each of them."}]}}
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: ERROR}
agents:
  - name: suivi
    main: {model: main}
YAML
done
printf 'sessions:\n  compaction: {model: summarizer, over_tokens: 2000, keep_last: 6}\n' \
    >> "$work/compacting/loom.yaml"

for project in plain compacting; do
    for i in $(seq 1 "$turns"); do
        # Letters, not digits: a number of 3 digits would be a marker the fixed summary lacks.
        id=$(printf "\\$(printf %o $((97 + i / 676 % 26)))\\$(printf %o $((97 + i / 26 % 26)))\\$(printf %o $((97 + i % 26)))")
        "$bin" --config "$work/$project/loom.yaml" run suivi \
            "Message $id of this long conversation about the quote for the kitchen renovation." \
            --session long --json 2>/dev/null |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["input_tokens"])' \
            >> "$work/$project/tokens"
    done
    python3 - "$project" "$work/$project" <<'PY'
import json, sys
name, dir = sys.argv[1], sys.argv[2]
tokens = [int(line) for line in open(f"{dir}/tokens")]
events = [json.loads(line) for line in open(f"{dir}/data/default/long.jsonl")]
runs = {e["run_id"] for e in events
        if e["type"] == "run.started" and e["payload"]["kind"] == "compaction"}
cost = sum(e["payload"]["usage"]["input_tokens"] for e in events
           if e["type"] == "model.responded" and e["run_id"] in runs)
print(f"{name:<11} runs {len(tokens)}  last {tokens[-1]}  mean {sum(tokens) // len(tokens)}"
      f"  total {sum(tokens)}  compactions {len(runs)} ({cost} input tokens)")
PY
done
