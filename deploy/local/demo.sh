#!/usr/bin/env bash
# See it work: start the local broker, create the topics, run the worker, produce messages with
# re-sent ids, print the verify summary and where the metrics are served.
#
#   deploy/local/demo.sh   (DEMO_MESSAGES=200000 DEMO_DUP_RATIO=0.05 change the load;
#                           DEMO_KEEP_RUNNING=1 leaves the worker running afterwards)
#   deploy/local/demo.sh --browser   a page with Segment's analytics.js pointed at the local
#                           front door, to click and watch the events arrive (demo-browser.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ "${1:-}" = --browser ]; then
  exec deploy/local/demo-browser.sh
fi
messages=${DEMO_MESSAGES:-100000}
dup_ratio=${DEMO_DUP_RATIO:-0.05}
. deploy/local/demo-common.sh
demo_setup demo
demo_start_worker
worker=$worker_pid
trap 'kill $worker 2>/dev/null || true' EXIT

echo "demo: producing $messages messages ($dup_ratio of them re-sent ids) to $input"
"$dedupe" loadgen --config config/local.toml --brokers "$brokers" --topic "$input" --count "$messages" --dup-ratio "$dup_ratio"

echo "demo: waiting for the worker to drain the input"
metrics=$worker_metrics
for _ in $(seq 1 300); do
  # Until the worker serves its metrics, curl fails: that is a wait, not an error.
  lag=$({ curl -s "http://$metrics/metrics" || true; } | awk '/^dedupe_consumer_lag_records/ {s += $2} END {print s + 0}')
  ready=$(curl -s -o /dev/null -w '%{http_code}' "http://$metrics/readyz" || true)
  if [ "$ready" = 200 ] && [ "$lag" = 0 ]; then break; fi
  sleep 1
done
sleep 6 # one more stats interval, so the lag gauge is fresh

echo "demo: verify (every input id exactly once in the output):"
verified=0
demo_verify || verified=$?
echo "demo: metrics at http://$metrics/metrics (readiness /readyz); duplicates dropped:"
curl -s "http://$metrics/metrics" | grep -E '^dedupe_(duplicates_dropped_total|records_in_total|records_out_total|window_seconds)' || true
if [ "${DEMO_KEEP_RUNNING:-0}" = 1 ]; then
  echo "demo: the worker keeps running until you press Ctrl-C (its log: $work/worker.log)"
  wait $worker
else
  echo "demo: stopping the worker (DEMO_KEEP_RUNNING=1 keeps it running; its log: $work/worker.log)"
  kill -TERM $worker
  wait $worker || true
fi
exit $verified
