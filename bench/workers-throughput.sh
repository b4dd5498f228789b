#!/usr/bin/env bash
# Background runs through RabbitMQ workers, and the cost of following a run.
#
# 1. Throughput, for 1, 2 and 4 `loom worker`s (each `--jobs JOBS`), from the journal
#    (loom_events) of the `chaos` agent's runs:
#    - drain: RUNS jobs queued while no worker runs, then the workers started; jobs/s = runs /
#      (first run.claimed -> last closing event);
#    - burst: RUNS runs submitted to an accept-only `serve` (8 requests at once) while the
#      workers run: how fast serve accepts them, and the p50 / p99 time from `run.started`
#      (written when the run is accepted) to its closing event, the wait in the queue included.
# 2. Follower CPU vs session length: FOLLOWS runs, each followed live over SSE
#    (`GET /v1/runs/{id}/events`) as soon as it is accepted, in a short session (a fresh one per
#    run) and in a long one (PRIOR runs first, ~17 events each): the `serve` process's CPU time
#    (utime + stime from /proc/<pid>/stat, 10 ms ticks) spent during the follows, per follow;
#    and, as the baseline, the same spent while runs of the long session go unfollowed (the
#    lease sweep and the other work of serve).
#
# Usage: bench/workers-throughput.sh [RUNS=300] [JOBS=8] [FOLLOWS=60] [PRIOR=120]
# Services: LOOM_TEST_POSTGRES, LOOM_TEST_RABBITMQ (see bench/fleet.sh); psql and curl.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-300}
JOBS=${2:-8}
FOLLOWS=${3:-60}
PRIOR=${4:-120}
# shellcheck source=bench/fleet.sh
. bench/fleet.sh

fleet_build
trap fleet_teardown EXIT
fleet_setup "wtp_$(date +%s)_$RANDOM"
serve_start

# latency PREFIX: count | p50 ms | p99 ms of run.started -> closing event.
latency() {
  sql "WITH s AS (SELECT run_id, ts FROM loom_events WHERE run_id LIKE '$1-%' AND type = 'run.started'),
            c AS (SELECT run_id, ts FROM loom_events WHERE run_id LIKE '$1-%'
                  AND type IN ('run.completed', 'run.failed', 'run.cancelled'))
       SELECT count(*),
              percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM c.ts - s.ts) * 1000),
              percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM c.ts - s.ts) * 1000)
       FROM s JOIN c USING (run_id)"
}

# drained PREFIX: seconds from the first run.claimed to the last closing event.
drained() {
  sql "SELECT extract(epoch FROM max(ts) FILTER (WHERE type IN ('run.completed', 'run.failed', 'run.cancelled'))
                              - min(ts) FILTER (WHERE type = 'run.claimed'))
       FROM loom_events WHERE run_id LIKE '$1-%'"
}

printf '\n%-8s %6s %14s %16s %9s %9s\n' workers runs "drain jobs/s" "burst accepted/s" p50_ms p99_ms
for workers in 1 2 4; do
  # Drain: RUNS jobs queued with no worker, then the workers started.
  submit "q$workers" "$RUNS"
  for i in $(seq 1 "$workers"); do worker_start "$i" "$JOBS"; done
  wait_closed "q$workers" "$RUNS" 600
  drain=$(drained "q$workers")
  # Burst: RUNS runs submitted to running workers; latency includes the wait in the queue.
  burst_start=$(now)
  submit "b$workers" "$RUNS"
  burst_end=$(now)
  wait_closed "b$workers" "$RUNS" 600
  workers_stop
  latency "b$workers" | awk -F'|' -v w="$workers" -v d="$drain" -v s="$burst_start" -v e="$burst_end" \
    '{printf "%-8s %6d %14.1f %16.1f %9.0f %9.0f\n", w, $1, $1 / d, $1 / (e - s), $2, $3}'
done

# Follower CPU: one worker drives the runs.
worker_start 1 "$JOBS"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVE_PID/stat"; }
ticks_per_s=$(getconf CLK_TCK)

# follow_runs SESSION_MODE PREFIX: FOLLOWS runs, each submitted then followed to its end; prints
# the serve CPU spent while following (ms per follow) and the events each stream carried.
follow_runs() {
  local mode=$1 prefix=$2 total=0 events=0 i session before after body
  for i in $(seq 1 "$FOLLOWS"); do
    if [ "$mode" = short ]; then session="$prefix-s$i"; else session=long; fi
    [ "$mode" = none ] && session=long
    body="{\"message\": \"go\", \"background\": true, \"run_id\": \"$prefix-$i\", \"session_id\": \"$session\"}"
    curl -sf -o /dev/null -H 'content-type: application/json' -d "$body" \
      "http://$SERVE_ADDR/v1/agents/chaos/runs"
    before=$(cpu_ticks)
    if [ "$mode" = none ]; then
      # The same run in the long session, not followed: what serve spends meanwhile anyway.
      wait_closed "$prefix" "$i" 60
    else
      events=$(( events + $(curl -sfN --max-time 60 \
        "http://$SERVE_ADDR/v1/runs/$prefix-$i/events?session_id=$session" | grep -c '^event:') ))
    fi
    after=$(cpu_ticks)
    total=$(( total + after - before ))
  done
  awk -v t="$total" -v n="$FOLLOWS" -v hz="$ticks_per_s" -v e="$events" \
    'BEGIN {printf "%.2f %.1f", t * 1000 / hz / n, e / n}'
}

# The long session: PRIOR runs one after the other.
for i in $(seq 1 "$PRIOR"); do
  curl -sf -o /dev/null -H 'content-type: application/json' \
    -d "{\"message\": \"go\", \"background\": true, \"run_id\": \"p$i-0\", \"session_id\": \"long\"}" \
    "http://$SERVE_ADDR/v1/agents/chaos/runs"
  wait_closed "p$i" 1 120
done
long_events=$(sql "SELECT count(*) FROM loom_events WHERE session_id = 'long'")

read -r short_cpu short_streamed <<<"$(follow_runs short fs)"
read -r long_cpu long_streamed <<<"$(follow_runs long fl)"
read -r idle_cpu _ <<<"$(follow_runs none fn)"
long_after=$(sql "SELECT count(*) FROM loom_events WHERE session_id = 'long'")
workers_stop

printf '\n%-34s %9s %16s %15s\n' "follow (serve CPU)" follows "ms CPU / follow" "events / stream"
printf '%-34s %9d %16s %15s\n' "short session (fresh, 0 prior)" "$FOLLOWS" "$short_cpu" "$short_streamed"
printf '%-34s %9d %16s %15s\n' "long session ($long_events -> $long_after events)" "$FOLLOWS" "$long_cpu" "$long_streamed"
printf '%-34s %9d %16s %15s\n' "long session, not followed" "$FOLLOWS" "$idle_cpu" "-"
