#!/usr/bin/env bash
# Bench of the tracking API: for each route (`/v1/batch` with Basic auth and application/json, as
# the server libraries post; `/v1/b` with the write key in a text/plain body and an Origin, as the
# browser and mobile libraries post) and each number of connections, drives `dedupe ingest` with
# wrk (20-event batches, unique messageIds, each event with a random anonymousId and property so
# that compressing the producer's batches gains what it would on real events) for a bounded time,
# then measures the broker's own ceiling for the same number and size of records with Kafka's
# ProducerPerformance (acks=all, idempotent), in the same run. The rate limiter is on (a limit far
# above the load, so every request pays for its bucket and none is refused) and CORS is on for the
# Origin wrk sends.
#
# Connections: each wrk connection waits for its answer before it sends again, so at 32 of them
# the front door's rate is bounded by its latency (640 events in flight); at 128 (with
# ingest.max_in_flight_requests raised to 128, so none is refused) it is bounded by CPU, as the
# ceiling's is.
# Both are measured and printed. Each is measured BENCH_ROUNDS times, the front door and its
# ceiling back to back each time, so a machine that speeds up or slows down (these are shared)
# moves both sides of one ratio alike; the summary takes the median ratio. A warm-up
# (BENCH_WARMUP_SECONDS of wrk, then ProducerPerformance) comes first, unmeasured: the broker's JVM
# compiles its produce path in its first minutes, and without it the first route's front door ran
# against a colder broker than its ceiling did.
#
#   deploy/bench/ingest.sh            (BENCH_SECONDS=20 BENCH_CONNECTIONS="32 128" BENCH_ROUNDS=3
#                                      BENCH_PARTITIONS=6 BENCH_ROUTES="/v1/batch /v1/b"
#                                      BENCH_WARMUP_SECONDS=10)
#
# Prints one JSON line per round (route, connections, round, ingest_events_per_sec, ingest_p99_ms,
# kafka_ceiling_records_per_sec, ratio), then one summary line per route and number of
# connections (median_ratio, the ratios, the median rates). Installs what it lacks
# (deploy/local/install-deps.sh --tests).
# Needs: the dedupe binary ($DEDUPE_BIN, else $CARGO_TARGET_DIR/release/dedupe).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}
dedupe=${DEDUPE_BIN:-$CARGO_TARGET_DIR/release/dedupe}
seconds=${BENCH_SECONDS:-20}
connections_list=${BENCH_CONNECTIONS:-32 128}
warmup_seconds=${BENCH_WARMUP_SECONDS:-10}
rounds=${BENCH_ROUNDS:-3}
partitions=${BENCH_PARTITIONS:-6}
threads=${BENCH_THREADS:-2}
routes=${BENCH_ROUTES:-/v1/batch /v1/b}
e2e_connections_list=${BENCH_E2E_CONNECTIONS:-32}
e2e_rounds=${BENCH_E2E_ROUNDS:-1}

die() { echo "bench: $*" >&2; exit 1; }
deploy/local/install-deps.sh --tests
[ -x "$dedupe" ] || die "no dedupe binary at $dedupe (cargo build --release -p dedupe-cli)"
command -v wrk >/dev/null || die "wrk is not installed"
command -v kcat >/dev/null || die "kcat is not installed"

brokers=$(deploy/local/kafka.sh up | tail -n 1)
cp=$(deploy/local/kafka.sh classpath)
java_tool() { java -Xmx512m -cp "$cp" "$@"; }
run_id=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
work=$(mktemp -d)
ingest_pid=""
worker_pid=""

cleanup() {
  for pid in $ingest_pid $worker_pid; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  # Whatever a round left, in one call (the option takes a regular expression).
  java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --delete --topic "bench-.*-$run_id" \
    >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

export BENCH_WRITE_KEY="bench-$run_id" BENCH_ORIGIN="http://bench.example"

# The CPU time (user and system, in clock ticks) process $1 has used.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# A port nothing listens on.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts `dedupe ingest` on port $1, writing to topic $2, and waits until it is ready. The rate
# limiter and CORS on, as production would run them: a limit no request reaches, with a burst over
# any request; places in flight for every connection of the larger round, so that none is refused.
start_ingest() {
  local port=$1 topic=$2
  DEDUPE_WRITE_KEYS="$BENCH_WRITE_KEY=bench" DEDUPE_LOG_LEVEL=warn \
    DEDUPE_INGEST_RATE_LIMIT_EVENTS_PER_SEC=100000000 DEDUPE_INGEST_CORS_ORIGINS="[\"$BENCH_ORIGIN\"]" \
    DEDUPE_INGEST_MAX_IN_FLIGHT_REQUESTS=128 \
    "$dedupe" ingest --listen "127.0.0.1:$port" --brokers "$brokers" --topic "$topic" >"$work/ingest.log" 2>&1 &
  ingest_pid=$!
  wait_ready "http://127.0.0.1:$port/readyz" "$ingest_pid" "$work/ingest.log" "dedupe ingest"
}

# Waits until $1 answers 200, while process $2 (logging to $3, named $4) runs.
wait_ready() {
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" 2>/dev/null || true)" = 200 ] && return 0
    kill -0 "$2" 2>/dev/null || { cat "$3" >&2; die "$4 exited"; }
    sleep 0.1
  done
  die "$4 was not ready within 60 s"
}

# One round of one route at one number of connections: wrk against a fresh `dedupe ingest`, then
# ProducerPerformance for as many records. With "warmup" as the third argument, runs for
# BENCH_WARMUP_SECONDS and prints no figures.
bench_route() {
  local route=$1 connections=$2 phase=${3:-measure} round=${4:-0} name seconds=$seconds
  name=$(echo "$route" | tr -c 'a-z0-9\n' '-' | sed 's/^-*//')-c$connections-$phase$round
  [ "$phase" = warmup ] && seconds=$warmup_seconds
  local ingest_topic="bench-ingest-$name-$run_id" ceiling_topic="bench-ceiling-$name-$run_id"
  for t in "$ingest_topic" "$ceiling_topic"; do
    java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --create --topic "$t" \
      --partitions "$partitions" --replication-factor 1 >/dev/null
  done

  local port
  port=$(free_port)
  start_ingest "$port" "$ingest_topic"
  echo "bench: $phase: wrk for ${seconds}s on $route, $connections connections, 20 events per request, against $ingest_topic ($partitions partitions)" >&2
  local cpu_before cpu_after
  cpu_before=$(cpu_ticks "$ingest_pid")
  BENCH_RUN_ID="$run_id-$name" BENCH_PATH="$route" wrk -t"$threads" -c"$connections" -d"${seconds}s" --timeout 30s \
    -s deploy/bench/ingest.lua "http://127.0.0.1:$port$route" >"$work/wrk.out"
  cpu_after=$(cpu_ticks "$ingest_pid")
  cat "$work/wrk.out" >&2
  local wrk_json
  wrk_json=$(grep '^{' "$work/wrk.out" | tail -n 1)
  kill "$ingest_pid"; wait "$ingest_pid" 2>/dev/null || true; ingest_pid=""

  # What landed: the record count (every 200 must be there) and the mean record size.
  local landed record_bytes requests non_2xx duration_us p99_us per_request
  landed=$(java_tool org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$brokers" --topic "$ingest_topic" 2>/dev/null \
    | awk -F: '{s += $3} END {print s + 0}')
  record_bytes=$(kcat -C -b "$brokers" -t "$ingest_topic" -p 0 -o beginning -c 200 -e -q -f '%S\n' | awk '{s += $1; n++} END {printf "%d", (n ? s / n : 0)}')

  read -r requests non_2xx duration_us p99_us per_request < <(python3 -c '
import json, sys; w = json.loads(sys.argv[1])
print(w["requests"], w["non_2xx"], w["duration_us"], w["p99_us"], w["events_per_request"])' "$wrk_json")
  local accepted_events=$(( (requests - non_2xx) * per_request ))
  [ "$landed" -ge "$accepted_events" ] || die "only $landed records landed for $accepted_events acknowledged events"
  [ "$accepted_events" -gt 0 ] || die "no request was accepted (see the wrk output above)"

  echo "bench: Kafka's ProducerPerformance: $accepted_events records of $record_bytes bytes, acks=all, idempotent" >&2
  java_tool org.apache.kafka.tools.ProducerPerformance --topic "$ceiling_topic" --num-records "$accepted_events" \
    --record-size "$record_bytes" --throughput -1 \
    --producer-props bootstrap.servers="$brokers" acks=all enable.idempotence=true >"$work/perf.out" 2>"$work/perf.err" \
    || { cat "$work/perf.err" >&2; die "ProducerPerformance failed"; }
  tail -n 1 "$work/perf.out" >&2
  local ceiling
  ceiling=$(tail -n 1 "$work/perf.out" | sed -n 's/.* records sent, \([0-9.]*\) records\/sec.*/\1/p')
  [ -n "$ceiling" ] || die "cannot read ProducerPerformance's result"

  # The round's records are not needed any more: free the broker's disk before the next round.
  java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --delete \
    --topic "bench-(ingest|ceiling)-$name-$run_id" >/dev/null 2>&1 || true
  [ "$phase" = warmup ] && return 0
  python3 -c '
import json, os, sys
connections, round_ = int(sys.argv[10]), int(sys.argv[11])
route, accepted, duration_us, p99_us, ceiling, non_2xx, requests, record_bytes, landed = sys.argv[1:10]
cpu_ticks = int(sys.argv[12])
eps = int(accepted) / (int(duration_us) / 1e6)
print(json.dumps({
    "route": route,
    "connections": connections,
    "round": round_,
    "ingest_events_per_sec": round(eps),
    "ingest_p99_ms": round(int(p99_us) / 1000, 1),
    "kafka_ceiling_records_per_sec": round(float(ceiling)),
    "ratio": round(eps / float(ceiling), 2),
    "ingest_cpu_us_per_event": round(cpu_ticks / os.sysconf("SC_CLK_TCK") * 1e6 / int(accepted), 2),
    "requests": int(requests), "non_2xx": int(non_2xx), "records_landed": int(landed), "record_bytes": int(record_bytes),
}))' "$route" "$accepted_events" "$duration_us" "$p99_us" "$ceiling" "$non_2xx" "$requests" "$record_bytes" "$landed" "$connections" "$round" \
    "$((cpu_after - cpu_before))" | tee -a "$work/rounds.jsonl"
}

# One end-to-end round of one route: the worker deduplicating behind the front door, wrk posting
# as in the other rounds, and `dedupe bench latency` reading the output topic read_committed as it
# is written: each record's time from its request's receipt (its timestamp) to being readable.
bench_e2e() {
  local route=$1 connections=$2 round=$3 name
  name=$(echo "$route" | tr -c 'a-z0-9\n' '-' | sed 's/^-*//')-c$connections-e2e$round
  local input="bench-e2e-in-$name-$run_id" output="bench-e2e-out-$name-$run_id"
  for t in "$input" "$output"; do
    java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --create --topic "$t" \
      --partitions "$partitions" --replication-factor 1 >/dev/null
  done
  local metrics_port port
  metrics_port=$(free_port)
  DEDUPE_LOG_LEVEL=warn "$dedupe" run --brokers "$brokers" --input-topic "$input" \
    --output-topic "$output" --data-dir "$work/ledger-$name" --metrics-addr "127.0.0.1:$metrics_port" \
    >"$work/worker.log" 2>&1 &
  worker_pid=$!
  wait_ready "http://127.0.0.1:$metrics_port/readyz" "$worker_pid" "$work/worker.log" "dedupe run"
  port=$(free_port)
  start_ingest "$port" "$input"

  echo "bench: e2e: wrk for ${seconds}s on $route, $connections connections, the worker behind, reading $output" >&2
  "$dedupe" bench latency --brokers "$brokers" --output-topic "$output" \
    --seconds $((seconds + 5)) >"$work/latency.json" 2>"$work/latency.err" &
  local latency_pid=$!
  sleep 2
  BENCH_RUN_ID="$run_id-$name" BENCH_PATH="$route" wrk -t"$threads" -c"$connections" -d"${seconds}s" --timeout 30s \
    -s deploy/bench/ingest.lua "http://127.0.0.1:$port$route" >"$work/wrk.out"
  wait "$latency_pid" || { cat "$work/latency.err" >&2; die "dedupe bench latency failed"; }
  kill "$ingest_pid"; wait "$ingest_pid" 2>/dev/null || true; ingest_pid=""
  kill "$worker_pid"; wait "$worker_pid" 2>/dev/null || true; worker_pid=""
  rm -rf "$work/ledger-$name"
  java_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --delete \
    --topic "bench-e2e-(in|out)-$name-$run_id" >/dev/null 2>&1 || true

  python3 -c '
import json, sys
w = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
l = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
accepted = (w["requests"] - w["non_2xx"]) * w["events_per_request"]
if l["records"] < accepted:
    sys.exit("bench: the reader saw %d records for %d acknowledged events" % (l["records"], accepted))
print(json.dumps({
    "route": sys.argv[3], "connections": int(sys.argv[4]), "round": int(sys.argv[5]), "e2e": True,
    "e2e_events_per_sec": round(accepted / (w["duration_us"] / 1e6)),
    "e2e_p50_ms": l["p50_ms"], "e2e_p99_ms": l["p99_ms"], "e2e_max_ms": l["max_ms"],
    "ingest_p99_ms": round(w["p99_us"] / 1000, 1), "non_2xx": w["non_2xx"], "records_read": l["records"],
}))' "$work/wrk.out" "$work/latency.json" "$route" "$connections" "$round" | tee -a "$work/e2e.jsonl"
}

first_route=${routes%% *}
bench_route "$first_route" "${connections_list##* }" warmup
for route in $routes; do
  for connections in $connections_list; do
    for round in $(seq 1 "$rounds"); do
      bench_route "$route" "$connections" measure "$round"
    done
  done
done

# The summary: per route and number of connections, the median of the rounds.
python3 -c '
import json, statistics, sys
rounds = [json.loads(line) for line in open(sys.argv[1])]
for key in dict.fromkeys((r["route"], r["connections"]) for r in rounds):
    rs = [r for r in rounds if (r["route"], r["connections"]) == key]
    print(json.dumps({
        "route": key[0], "connections": key[1], "rounds": len(rs),
        "median_ratio": round(statistics.median(r["ratio"] for r in rs), 2),
        "ratios": [r["ratio"] for r in rs],
        "median_ingest_events_per_sec": round(statistics.median(r["ingest_events_per_sec"] for r in rs)),
        "median_kafka_ceiling_records_per_sec": round(statistics.median(r["kafka_ceiling_records_per_sec"] for r in rs)),
        "median_ingest_p99_ms": round(statistics.median(r["ingest_p99_ms"] for r in rs), 1),
    }))' "$work/rounds.jsonl"

# End to end, after the front door alone: the same routes with the worker behind.
for route in $routes; do
  for connections in $e2e_connections_list; do
    for round in $(seq 1 "$e2e_rounds"); do
      bench_e2e "$route" "$connections" "$round"
    done
  done
done
[ -s "$work/e2e.jsonl" ] && python3 -c '
import json, statistics, sys
rounds = [json.loads(line) for line in open(sys.argv[1])]
for key in dict.fromkeys((r["route"], r["connections"]) for r in rounds):
    rs = [r for r in rounds if (r["route"], r["connections"]) == key]
    print(json.dumps({
        "route": key[0], "connections": key[1], "e2e_rounds": len(rs),
        "median_e2e_events_per_sec": round(statistics.median(r["e2e_events_per_sec"] for r in rs)),
        "median_e2e_p50_ms": statistics.median(r["e2e_p50_ms"] for r in rs),
        "median_e2e_p99_ms": statistics.median(r["e2e_p99_ms"] for r in rs),
    }))' "$work/e2e.jsonl"
