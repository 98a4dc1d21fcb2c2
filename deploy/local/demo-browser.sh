#!/usr/bin/env bash
# The tracking API from a browser: start the local broker, the worker and `dedupe ingest` with CORS
# for a local page, and serve that page, which loads Segment's own analytics.js (from the pinned
# @segment/analytics-next) with only its CDN pointed at the local front door. Open the address it
# prints, click, and watch the counts below it: events taken by the front door, records through
# the worker, duplicates dropped. Ctrl-C stops everything and prints `dedupe verify`.
#
#   deploy/local/demo.sh --browser   (DEMO_PAGE_PORT=8000 DEMO_STRATEGY=standard|batching)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
page_port=${DEMO_PAGE_PORT:-8000}
strategy=${DEMO_STRATEGY:-standard}
. deploy/local/demo-common.sh
demo_setup demo-browser --browser
# A key for this demo only; it is public in the page anyway, as every browser write key is.
write_key=demo-browser-$run_id

api=$(sed -n '/^\[ingest\]/,/^\[/ s/^listen = "\(.*\)"/\1/p' config/local.toml)
ingest_metrics=127.0.0.1:9465
origins="[\"http://localhost:$page_port\", \"http://127.0.0.1:$page_port\"]"

pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT

demo_start_worker
pids+=("$worker_pid")
DEDUPE_WRITE_KEYS="$write_key=browser-demo" DEDUPE_INGEST_CORS_ORIGINS="$origins" \
  "$dedupe" ingest --config config/local.toml --brokers "$brokers" --topic "$input" --metrics-addr "$ingest_metrics" \
  >"$work/ingest.log" 2>&1 &
pids+=($!)
PAGE_PORT=$page_port node tests/js/serve_pages.mjs >"$work/pages.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$api/readyz" || true)" = 200 ] && break
  sleep 0.2
done
url="http://localhost:$page_port/demo.html?key=$write_key&api=http://$api&strategy=$strategy"
echo
echo "demo: open $url"
echo "demo: the front door's metrics: http://$ingest_metrics/metrics; the worker's: http://$worker_metrics/metrics"
echo "demo: logs in $work; Ctrl-C stops the demo"
echo

sum() { curl -s "http://$1/metrics" | awk -v m="$2" '$1 ~ "^"m"({|$)" {s += $2} END {printf "%d", s}'; }
verify() {
  echo
  echo "demo: verify (every input id exactly once in the output):"
  demo_verify || true
  exit 0
}
trap 'trap - INT; verify' INT
while sleep 2; do
  printf '\rdemo: events taken by the front door %s | records into the worker %s | out %s | duplicates dropped %s   ' \
    "$(sum "$ingest_metrics" dedupe_ingest_events_total)" "$(sum "$worker_metrics" dedupe_records_in_total)" \
    "$(sum "$worker_metrics" dedupe_records_out_total)" "$(sum "$worker_metrics" dedupe_duplicates_dropped_total)"
done
