#!/usr/bin/env bash
# See it work: start the local broker, create the topics, run the worker, produce messages of
# which some are retries (the same record sent again) and a few reuse an id for other content,
# then print a short summary: what came in, what went out, what was dropped and why, the window,
# `dedupe verify`'s verdict, and one dropped id explained.
#
#   deploy/local/demo.sh   (DEMO_MESSAGES=200000 DEMO_DUP_RATIO=0.05 DEMO_REUSED_RATIO=0.001
#                           change the load; DEMO_KEEP_RUNNING=1 leaves the worker running)
#   deploy/local/demo.sh --browser   a page with Segment's analytics.js pointed at the local
#                           front door, to click and watch the events arrive (demo-browser.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ "${1:-}" = --browser ]; then
  exec deploy/local/demo-browser.sh
fi
started=$SECONDS
messages=${DEMO_MESSAGES:-100000}
dup_ratio=${DEMO_DUP_RATIO:-0.05}
reused_ratio=${DEMO_REUSED_RATIO:-0.001}
. deploy/local/demo-common.sh
demo_setup demo
demo_start_worker
worker=$worker_pid
trap 'kill $worker 2>/dev/null || true' EXIT

demo_phase 4/6 "producing $messages messages: $dup_ratio of them retries, $reused_ratio reusing an id for other content (seconds)"
load=$("$dedupe" loadgen --config config/local.toml --brokers "$brokers" --topic "$input" --count "$messages" \
  --dup-ratio "$dup_ratio" --reused-ratio "$reused_ratio")

demo_phase 5/6 "waiting for the worker to drain the input (seconds)"
metrics=$worker_metrics
page() { curl -s "http://$metrics/metrics" || true; }
# The sum of a metric's series whose labels contain $2 (all of them without it).
total() { page | awk -v m="$1" -v l="${2:-}" '$1 ~ "^"m"({|$)" && index($1, l) {s += $2} END {printf "%d", s}'; }
for _ in $(seq 1 300); do
  # Until the worker serves its metrics, curl fails: that is a wait, not an error.
  ready=$(curl -s -o /dev/null -w '%{http_code}' "http://$metrics/readyz" || true)
  if [ "$ready" = 200 ] && [ "$(total dedupe_records_in_total)" -ge "$messages" ]; then break; fi
  sleep 1
done

# The window gauge is refreshed every few seconds: wait for its first value.
for _ in $(seq 1 15); do
  page | grep -q '^dedupe_window_seconds{' && break
  sleep 1
done

demo_phase 6/6 "checking the output and summing up"
verified=0
verify=$(demo_verify) || verified=$?
sent_retries=$(echo "$load" | sed -n 's/.*"resent":\([0-9]*\).*/\1/p')
sent_reused=$(echo "$load" | sed -n 's/.*"reused":\([0-9]*\).*/\1/p')
windows=$(page | awk '/^dedupe_window_seconds\{/ { match($1, /partition="[0-9]+"/); print substr($1, RSTART + 11, RLENGTH - 12), $2 }' \
  | sort -n | awk '{ printf "%s%s: %.0f s", sep, $1, $2; sep = ", " }')
if [ "$verified" = 0 ]; then verdict="ok: every input id is in the output exactly once"; else verdict="FAILED (exit $verified): $verify"; fi
printf '\n%-28s %s\n' "records in" "$(total dedupe_records_in_total)"
printf '%-28s %s\n' "published" "$(total dedupe_records_out_total)"
printf '%-28s %s (%s sent)\n' "dropped as retries" "$(total dedupe_duplicates_dropped_total 'verdict="retry"')" "$sent_retries"
printf '%-28s %s (%s sent)\n' "dropped as reused ids" "$(total dedupe_duplicates_dropped_total 'verdict="reused_id"')" "$sent_reused"
printf '%-28s %s\n' "window per partition" "${windows:-none yet}"
printf '%-28s %s\n\n' "dedupe verify" "$verdict"

# One dropped copy, from the duplicate audit (written in the same transaction as the output).
dropped=$(kcat -b "$brokers" -C -t "$output.duplicates" -X isolation.level=read_committed -c 1 -e -q -f '%k\n' 2>/dev/null | head -n 1 || true)
if [ -n "$dropped" ]; then
  echo "demo: why was $dropped dropped? dedupe explain says:"
  "$dedupe" explain "$dropped" --config config/local.toml --metrics-addr "$metrics" | tail -n 1
fi
echo
echo "demo: the worker's metrics: curl http://$metrics/metrics (readiness: /readyz); the raw series behind the table:"
echo "        curl -s http://$metrics/metrics | grep -E '^dedupe_(records_(in|out)_total|duplicates_dropped_total|window_seconds)'"
echo "demo: the Grafana dashboard: deploy/grafana/dedupe.json (Prometheus rules: deploy/prometheus/); docs/operations.md explains each panel"
echo "demo: done in $((SECONDS - started)) s"
if [ "${DEMO_KEEP_RUNNING:-0}" = 1 ]; then
  echo "demo: the worker keeps running until you press Ctrl-C (its log: $work/worker.log)"
  wait $worker
else
  echo "demo: stopping the worker (DEMO_KEEP_RUNNING=1 keeps it running; its log: $work/worker.log)"
  kill -TERM $worker
  wait $worker || true
fi
exit $verified
