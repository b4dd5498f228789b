# Helpers sourced by bench/distributed-chaos.sh and bench/workers-throughput.sh: a fleet of the
# `chaos` example (examples/chaos/fleet.yaml) on a fresh PostgreSQL database and a RabbitMQ
# queue prefix of its own, one accept-only `serve` and `loom worker`s, and the journal queries.
#
# Services: LOOM_TEST_POSTGRES (default postgres://postgres@127.0.0.1:5432/test, a superuser:
# the queries read every tenant's rows) and LOOM_TEST_RABBITMQ (default the local guest URL).

PG_SERVER="${LOOM_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}"
AMQP_URL="${LOOM_TEST_RABBITMQ:-amqp://guest:guest@127.0.0.1:5672/%2f}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
CHAOS_BIN=""
declare -a WORKER_PIDS=()
SERVE_PID=""

now() { date +%s.%N; }

# fleet_build: the release `chaos` example (it holds `loom serve` and `loom worker`).
fleet_build() {
  cargo build --release --quiet -p loom-cli --example chaos
  CHAOS_BIN="$(cd "$CARGO_TARGET_DIR" && pwd)/release/examples/chaos"
}

# fleet_setup TAG: a database loom_b_TAG, a role loom_app_TAG, a directory $FLEET_DIR with the
# fleet's configuration whose queues are named TAG; exports what the processes read.
fleet_setup() {
  local tag=$1
  FLEET_TAG=$tag
  FLEET_DB="loom_b_$tag"
  FLEET_ROLE="loom_app_$tag"
  FLEET_DIR=$(mktemp -d)
  psql "$PG_SERVER" -qXc "CREATE DATABASE $FLEET_DB" >/dev/null
  FLEET_DSN="${PG_SERVER%/*}/$FLEET_DB"
  mkdir -p "$FLEET_DIR/agents"
  cp examples/chaos/agents/*.yaml "$FLEET_DIR/agents/"
  sed -e "s/name: loom-fleet/name: $tag/" \
      -e "s/dsn_env: LOOM_FLEET_PG,/dsn_env: LOOM_FLEET_PG, role: $FLEET_ROLE,/" \
      examples/chaos/fleet.yaml > "$FLEET_DIR/loom.yaml"
  grep -q "name: $tag" "$FLEET_DIR/loom.yaml" && grep -q "role: $FLEET_ROLE" "$FLEET_DIR/loom.yaml" \
    || { echo "examples/chaos/fleet.yaml changed: cannot set the queue name and role" >&2; exit 1; }
  export LOOM_FLEET_PG="$FLEET_DSN" LOOM_FLEET_AMQP="$AMQP_URL" CHAOS_FILE="$FLEET_DIR/effects.txt"
  unset LOOM_PROFILE LOOM_LOG
}

# fleet_teardown: stops what is left (SIGKILL: the run is over), drops the database and role.
fleet_teardown() {
  local pid
  for pid in "${WORKER_PIDS[@]}" $SERVE_PID; do
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ -n "${FLEET_DB:-}" ]; then
    psql "$PG_SERVER" -qXc "DROP DATABASE IF EXISTS $FLEET_DB WITH (FORCE)" >/dev/null 2>&1 || true
    psql "$PG_SERVER" -qXc "DROP ROLE IF EXISTS $FLEET_ROLE" >/dev/null 2>&1 || true
  fi
  [ -n "${FLEET_DIR:-}" ] && rm -rf "$FLEET_DIR"
  # The run's queues, when rabbitmqctl may be used here (best effort).
  if [ -n "${FLEET_TAG:-}" ] && command -v rabbitmqctl >/dev/null; then
    timeout 60 rabbitmqctl -q list_queues name 2>/dev/null | grep "^$FLEET_TAG\." |
      while read -r queue; do timeout 30 rabbitmqctl -q delete_queue "$queue" >/dev/null 2>&1 || true; done
  fi
  return 0
}

# serve_start: the accept-only `serve` on a free port; sets SERVE_PID and SERVE_ADDR.
serve_start() {
  local log="$FLEET_DIR/serve.log"
  (cd "$FLEET_DIR" && exec "$CHAOS_BIN" --config loom.yaml --no-env-file serve --port 0) 2>"$log" &
  SERVE_PID=$!
  local _
  for _ in $(seq 1 300); do
    SERVE_ADDR=$(sed -n 's/.*Listening on http:\/\/\([^ ]*\).*/\1/p' "$log" | head -1)
    [ -n "$SERVE_ADDR" ] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "serve did not start:" >&2
  cat "$log" >&2
  exit 1
}

# worker_start I [JOBS]: worker I (re)started; its pid in WORKER_PIDS[I].
worker_start() {
  local i=$1 jobs=${2:-8}
  (cd "$FLEET_DIR" && exec "$CHAOS_BIN" --config loom.yaml --no-env-file worker --jobs "$jobs") \
    2>>"$FLEET_DIR/worker-$i.log" &
  WORKER_PIDS[$i]=$!
}

# workers_stop: SIGTERM to every worker, then waits for them.
workers_stop() {
  local pid
  for pid in "${WORKER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${WORKER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  WORKER_PIDS=()
}

# submit PREFIX N [PARALLEL]: N background runs PREFIX-1 … PREFIX-N through REST; fails unless
# every answer is 202.
submit() {
  local prefix=$1 n=$2 parallel=${3:-8}
  local codes
  codes=$(seq 1 "$n" | xargs -P "$parallel" -I{} curl -s -o /dev/null -w '%{http_code}\n' \
    -H 'content-type: application/json' \
    -d "{\"message\": \"go\", \"background\": true, \"run_id\": \"$prefix-{}\"}" \
    "http://$SERVE_ADDR/v1/agents/chaos/runs" | sort | uniq -c)
  if [ "$(echo "$codes" | awk '$2 == 202 {print $1}')" != "$n" ]; then
    echo "submissions answered: $codes" >&2
    exit 1
  fi
}

# sql QUERY: one value (or rows, `|`-separated) from the fleet's database.
sql() {
  psql "$FLEET_DSN" -qAtX -c "$1"
}

# closed PREFIX: how many runs PREFIX-* have their closing event.
closed() {
  sql "SELECT count(DISTINCT run_id) FROM loom_events WHERE run_id LIKE '$1-%'
       AND type IN ('run.completed', 'run.failed', 'run.cancelled')"
}

# wait_closed PREFIX N TIMEOUT: waits until the N runs are closed (fails after TIMEOUT s).
wait_closed() {
  local prefix=$1 n=$2 timeout=$3 start
  start=$(now)
  until [ "$(closed "$prefix")" -ge "$n" ]; do
    if awk -v s="$start" -v n="$(now)" -v t="$timeout" 'BEGIN {exit !(n - s > t)}'; then
      echo "only $(closed "$prefix") of $n runs closed after ${timeout}s" >&2
      exit 1
    fi
    sleep 0.2
  done
}
