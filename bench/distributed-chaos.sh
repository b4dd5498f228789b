#!/usr/bin/env bash
# Distributed chaos: RUNS background runs of the `chaos` agent (its irreversible, idempotent tool
# appends one line per idempotency key to CHAOS_FILE) submitted to an accept-only `serve`, driven
# by WORKERS `loom worker`s on PostgreSQL and RabbitMQ, while a random worker is killed with
# SIGKILL and restarted again and again until every run closed. Then: 0 duplicate effects (no
# idempotency key twice in CHAOS_FILE), 0 lost runs (each submitted run has its closing event in
# the journal), every run completed. Prints runs, kills, duplicates, lost, wall time.
#
# Usage: bench/distributed-chaos.sh [RUNS=500] [WORKERS=3] [JOBS=8]
# Services: LOOM_TEST_POSTGRES, LOOM_TEST_RABBITMQ (see bench/fleet.sh); psql and curl.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-500}
WORKERS=${2:-3}
JOBS=${3:-8}
# shellcheck source=bench/fleet.sh
. bench/fleet.sh

fleet_build
tag="dchaos_$(date +%s)_$RANDOM"
trap fleet_teardown EXIT
fleet_setup "$tag"
serve_start
for i in $(seq 1 "$WORKERS"); do worker_start "$i" "$JOBS"; done

start=$(now)
# Submitted while the workers are being killed.
(submit dc "$RUNS"; echo "$(now)" > "$FLEET_DIR/submitted") &
submitter=$!

kills=0
deadline=$(( $(date +%s) + 1800 ))
while [ "$(closed dc)" -lt "$RUNS" ]; do
  if [ "$(date +%s)" -gt "$deadline" ]; then
    echo "distributed-chaos: only $(closed dc) of $RUNS runs closed after 30 min" >&2
    exit 1
  fi
  # A worker lives 0.1–0.6 s, then dies with SIGKILL wherever it is, and is started again.
  sleep "0.$(( 1 + RANDOM % 5 ))$(( RANDOM % 10 ))"
  victim=$(( 1 + RANDOM % WORKERS ))
  kill -KILL "${WORKER_PIDS[$victim]}" 2>/dev/null || true
  wait "${WORKER_PIDS[$victim]}" 2>/dev/null || true
  kills=$(( kills + 1 ))
  worker_start "$victim" "$JOBS"
done
end=$(now)
wait "$submitter" || { echo "distributed-chaos: a submission failed" >&2; exit 1; }
submitted=$(cat "$FLEET_DIR/submitted")
workers_stop

lines=$(wc -l < "$CHAOS_FILE")
duplicates=$(cut -d' ' -f1 "$CHAOS_FILE" | sort | uniq -d | wc -l)
closed_runs=$(closed dc)
lost=$(( RUNS - closed_runs ))
completed=$(sql "SELECT count(DISTINCT run_id) FROM loom_events WHERE run_id LIKE 'dc-%' AND type = 'run.completed'")
started=$(sql "SELECT count(DISTINCT run_id) FROM loom_events WHERE run_id LIKE 'dc-%' AND type = 'run.started'")
claims=$(sql "SELECT count(*) FROM loom_events WHERE run_id LIKE 'dc-%' AND type = 'run.claimed'")
workers_seen=$(sql "SELECT count(DISTINCT event::jsonb->'payload'->>'worker_id') FROM loom_events WHERE run_id LIKE 'dc-%' AND type = 'run.claimed'")
takeovers=$(sql "SELECT count(*) FROM (SELECT run_id FROM loom_events WHERE run_id LIKE 'dc-%' AND type = 'run.claimed'
                   GROUP BY run_id HAVING count(DISTINCT event::jsonb->'payload'->>'worker_id') > 1) t")
resumed=$(sql "SELECT count(*) FROM loom_events WHERE run_id LIKE 'dc-%' AND type = 'tool.called'
                 AND (event::jsonb->'payload'->>'resumed')::boolean")
depths=$(cd "$FLEET_DIR" && "$CHAOS_BIN" --config loom.yaml --no-env-file queue 2>&1 || true)

printf 'distributed-chaos: runs %d (journaled %d), workers %d x %d jobs, kills %d\n' \
  "$RUNS" "$started" "$WORKERS" "$JOBS" "$kills"
printf 'distributed-chaos: lines %d, duplicates %d, lost %d, completed %d\n' \
  "$lines" "$duplicates" "$lost" "$completed"
printf 'distributed-chaos: claims %d by %d worker ids, runs taken over by another worker %d, tool calls resumed %d\n' \
  "$claims" "$workers_seen" "$takeovers" "$resumed"
awk -v s="$start" -v m="$submitted" -v e="$end" \
  'BEGIN {printf "distributed-chaos: wall %.1f s (submitting %.1f s)\n", e - s, m - s}'
echo "distributed-chaos: queue after the run:"
echo "$depths" | sed 's/^/  /'
if [ "$duplicates" -ne 0 ] || [ "$lost" -ne 0 ] || [ "$completed" -ne "$RUNS" ] || [ "$lines" -ne "$RUNS" ]; then
  echo "distributed-chaos: FAILED" >&2
  exit 1
fi
echo "distributed-chaos: ok"
