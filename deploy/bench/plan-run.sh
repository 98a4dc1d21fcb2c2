#!/usr/bin/env bash
# A ten-minute ledger run against `dedupe plan`: one worker with the default configuration on the
# local broker (deploy/local/kafka.sh up), fed 5,000 records/s for 600 s by `dedupe loadgen`; then
# the ledger's bytes per id and ids per second, as docs/bench/plan-run.json records them. Prints one
# JSON line. DEDUPE_BIN names the binary (default: the release build in CARGO_TARGET_DIR or target/).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${DEDUPE_BIN:-${CARGO_TARGET_DIR:-target}/release/dedupe}
rate=${RATE:-5000}
seconds=${SECONDS_TO_RUN:-600}
port=${METRICS_PORT:-19777}
work=$(mktemp -d)
topic=planrun$(date +%s)
trap 'kill -TERM "${worker:-0}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
deploy/local/kafka.sh create-topic "$topic.in" 4 >/dev/null
deploy/local/kafka.sh create-topic "$topic.out" 4 >/dev/null
"$bin" run --brokers 127.0.0.1:9092 --input-topic "$topic.in" --output-topic "$topic.out" \
  --data-dir "$work/ledger" --metrics-addr "127.0.0.1:$port" >"$work/worker.log" 2>&1 &
worker=$!
until curl -sf "127.0.0.1:$port/readyz" >/dev/null; do sleep 1; done
load=$("$bin" loadgen --brokers 127.0.0.1:9092 --topic "$topic.in" --count $((rate * seconds)) \
  --rate "$rate" --dup-ratio 0.006 2>/dev/null | tail -n 1)
sleep 15 # two stats passes: the ledger's figures are exported every 5 s
metrics=$(curl -sf "127.0.0.1:$port/metrics")
python3 - "$load" "$metrics" <<'PY'
import json, sys
load = json.loads(sys.argv[1])
values = {}
for line in sys.argv[2].splitlines():
    name, _, value = line.partition(" ")
    if name in ("dedupe_ledger_ids", "dedupe_ledger_bytes"):
        values[name] = float(value)
ids, size = values["dedupe_ledger_ids"], values["dedupe_ledger_bytes"]
print(json.dumps({"seconds": load["seconds"], "records_sent": load["records_sent"],
                  "distinct_ids": load["distinct_ids"], "ledger_ids": int(ids),
                  "ledger_bytes": int(size), "bytes_per_id": size / ids,
                  "ids_per_sec": ids / load["seconds"]}))
PY
