#!/usr/bin/env bash
# Bench of `dedupe rekey` against a pass-through copy with the same transactions, in one run: a
# source topic of BENCH_RECORDS JSON records (dedupe loadgen: keyed by UUID, 1% retries) is copied
# into a fresh topic twice per round, once re-keyed by the JSON field `messageId`
# (worker.id_source = "json:/messageId": each value is parsed) and once with worker.id_source =
# "key" (each record keeps its key: the same stage, consumer, producer and transactions, nothing
# parsed), alternately, BENCH_ROUNDS times. Each copy is timed from the stage's start until its
# metrics count every record copied.
#
#   deploy/bench/rekey.sh      (BENCH_RECORDS=1000000 BENCH_ROUNDS=3 BENCH_PARTITIONS=4)
#
# Prints one JSON line per copy, then a summary line: the median records/s of each and their ratio.
# Needs: the dedupe binary ($DEDUPE_BIN, else $CARGO_TARGET_DIR/release/dedupe) and a broker
# (deploy/local/kafka.sh up is run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}
dedupe=${DEDUPE_BIN:-$CARGO_TARGET_DIR/release/dedupe}
records=${BENCH_RECORDS:-1000000}
rounds=${BENCH_ROUNDS:-3}
partitions=${BENCH_PARTITIONS:-4}
die() { echo "bench: $*" >&2; exit 1; }
[ -x "$dedupe" ] || die "no dedupe binary at $dedupe (cargo build --release -p dedupe-cli)"

brokers=$(deploy/local/kafka.sh up | tail -n 1)
cp=$(deploy/local/kafka.sh classpath)
topics() { java -Xmx512m -cp "$cp" org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" "$@"; }
run_id=$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
work=$(mktemp -d)
stage_pid=""
cleanup() {
  [ -n "$stage_pid" ] && { kill "$stage_pid" 2>/dev/null || true; wait "$stage_pid" 2>/dev/null || true; }
  topics --delete --topic "bench-rekey-.*-$run_id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

source_topic="bench-rekey-source-$run_id"
topics --create --topic "$source_topic" --partitions "$partitions" --replication-factor 1 >/dev/null
echo "bench: producing $records records to $source_topic ($partitions partitions)" >&2
"$dedupe" loadgen --brokers "$brokers" --topic "$source_topic" --count "$records" >/dev/null

# One copy: $1 the id source, $2 the copy's name. Prints its JSON line.
copy() {
  local id_source=$1 name=$2 target="bench-rekey-$2-$run_id" port
  topics --create --topic "$target" --partitions "$partitions" --replication-factor 1 >/dev/null
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  local started
  started=$(date +%s.%N)
  DEDUPE_WORKER_ID_SOURCE=$id_source DEDUPE_LOG_LEVEL=warn "$dedupe" rekey --brokers "$brokers" \
    --source-topic "$source_topic" --input-topic "$target" --group-id "bench-rekey-$name-$run_id" \
    --metrics-addr "127.0.0.1:$port" 2>"$work/stage.log" &
  stage_pid=$!
  local copied=0
  while [ "$copied" -lt "$records" ]; do
    kill -0 "$stage_pid" 2>/dev/null || { cat "$work/stage.log" >&2; die "the stage exited"; }
    sleep 0.05
    copied=$(curl -s "http://127.0.0.1:$port/metrics" 2>/dev/null \
      | awk '/^dedupe_rekey_records_total/ {s += $2} END {printf "%d", s}')
  done
  local ended
  ended=$(date +%s.%N)
  kill "$stage_pid"; wait "$stage_pid" 2>/dev/null || true; stage_pid=""
  topics --delete --topic "$target" >/dev/null 2>&1 || true
  python3 -c 'import json,sys; n,s,e,src=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]),sys.argv[4]
print(json.dumps({"copy": sys.argv[5], "id_source": src, "records": n, "secs": round(e - s, 2), "records_per_sec": round(n / (e - s))}))' \
    "$records" "$started" "$ended" "$id_source" "${name%-*}" | tee -a "$work/copies.jsonl"
}

for round in $(seq 1 "$rounds"); do
  copy "json:/messageId" "rekey-$round"
  copy "key" "passthrough-$round"
done
python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda c: statistics.median(r["records_per_sec"] for r in rows if r["copy"] == c)
rekey, through = med("rekey"), med("passthrough")
print(json.dumps({"rekey_records_per_sec": round(rekey), "passthrough_records_per_sec": round(through),
                  "ratio": round(rekey / through, 2), "rounds": len(rows) // 2, "records": rows[0]["records"]}))' "$work/copies.jsonl"
