#!/usr/bin/env bash
# The container tests: the image deploy/local/image.sh built, run by podman against the local
# broker on the host network, with the image's own default configuration. Each check prints
# `image-check: ok: ...`; the first that fails prints `image-check: FAIL: ...` with the container's
# log and exits 1. Started by `deploy/local/image.sh check` (and deploy/local/test.sh).
#
#  1. the worker runs as uid 10001 on a read-only root filesystem with a volume for
#     /var/lib/dedupe, turns healthy by its own HEALTHCHECK and dedupes a load with re-sent ids;
#  2. `podman stop` (SIGTERM, 30 s grace) ends it with exit 0 within the grace;
#  3. a new container on the same volume opens the ledger from its stored index and publishes
#     nothing twice when the whole input is sent again;
#  4. the ingest container takes events from Segment's Python library, each sent twice, and every
#     one reaches the output once through the worker container;
#  5. a root-owned volume (a fresh Kubernetes volume without fsGroup) is one clear error naming
#     the directory and the uid, not a panic.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}
image=${DEDUPE_IMAGE:-localhost/dedupe:latest}
brokers=${DEDUPE_TEST_BROKERS:-127.0.0.1:9092}
dedupe=$CARGO_TARGET_DIR/release/dedupe
venv=${DEDUPE_VENV:-/var/tmp/dedupe-venv}
ulimits=(--ulimit nofile=16384:16384 --ulimit nproc=4096:4096)
run_id=$(date +%s)-$$
input=image-check-in-$run_id
output=image-check-out-$run_id
volume=dedupe-check-$run_id
worker=dedupe-check-worker-$run_id
scratch=$(mktemp -d)
containers=()

# Without systemd, podman cannot schedule the health check's timer and says so on every start and
# stop; the check itself runs by `podman healthcheck run`, so those lines are left out.
pm() { podman --runtime runc "$@" 2> >(grep -v 'systemd connection' >&2); }
cleanup() {
  local c
  for c in "${containers[@]}"; do pm rm -f -v -t 0 "$c" >/dev/null 2>&1 || true; done
  pm volume rm -f "$volume" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT
ok() { echo "image-check: ok: $*"; }
fail() {
  echo "image-check: FAIL: $1" >&2
  if [ -n "${2:-}" ]; then echo "--- log of $2:" >&2; pm logs "$2" 2>&1 | tail -n 40 >&2; fi
  exit 1
}
# wait_for SECONDS WHAT CMD...: polls CMD every half second.
wait_for() {
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}
metrics() { curl -sf http://127.0.0.1:9464/metrics; }
verified() { "$dedupe" verify --brokers "$brokers" --input-topic "$input" --output-topic "$output" --timeout-secs 20; }
out_records() { metrics | awk '/^dedupe_records_out_total/ {s += $2} END {print s + 0}'; }

pm image exists "$image" || fail "no image $image: run deploy/local/image.sh build first"
[ -x "$dedupe" ] || fail "no dedupe binary at $dedupe (for loadgen and verify)"
! curl -s -o /dev/null http://127.0.0.1:9464/ || fail "port 9464, where the image's health check asks, is taken on this host"
deploy/local/kafka.sh up >/dev/null
deploy/local/kafka.sh create-topic "$input" 4 >/dev/null 2>&1
deploy/local/kafka.sh create-topic "$output" 4 >/dev/null 2>&1
pm volume create "$volume" >/dev/null
# The host network (no registry-free bridge here); the metrics listener on loopback, where the
# image's HEALTHCHECK asks.
worker_run=(pm run -d --network host --read-only "${ulimits[@]}" -v "$volume:/var/lib/dedupe"
  -e "DEDUPE_KAFKA_BROKERS=$brokers" -e "DEDUPE_WORKER_INPUT_TOPIC=$input"
  -e "DEDUPE_WORKER_OUTPUT_TOPIC=$output" -e DEDUPE_METRICS_ADDR=127.0.0.1:9464)

# 0. The image's binary serves and operates; it carries no bench and no load generator.
help=$(pm run --rm --network none "${ulimits[@]}" --entrypoint /usr/local/bin/dedupe "$image" --help) \
  || fail "dedupe --help failed in the image"
grep -qE '^  run ' <<<"$help" || fail "the image's dedupe --help lists no run: $help"
! grep -qE '^  (bench|loadgen) ' <<<"$help" || fail "the image's dedupe lists bench or loadgen: $help"
ok "the image's dedupe --help lists run, ingest, verify, explain and ledger, and no bench or loadgen"

# 1. Unprivileged, read-only, healthy by its own check, deduplicating.
started=$SECONDS
containers+=("$worker-1")
"${worker_run[@]}" --name "$worker-1" "$image" >/dev/null
wait_for 180 "healthy" pm healthcheck run "$worker-1" || fail "the worker did not turn healthy within 180 s" "$worker-1"
healthy_secs=$((SECONDS - started))
uids=$(pm exec "$worker-1" awk '/^Uid:/ {print $2, $3, $4, $5}' /proc/1/status)
[ "$uids" = "10001 10001 10001 10001" ] || fail "the worker runs as uids $uids, not 10001" "$worker-1"
! pm exec "$worker-1" touch /usr/local/bin/written 2>/dev/null || fail "the root filesystem is writable"
ok "worker healthy by its HEALTHCHECK in ${healthy_secs} s, as uid 10001 on a read-only root"
load=$("$dedupe" loadgen --brokers "$brokers" --topic "$input" --count 20000 --dup-ratio 0.05)
distinct=$(sed -n 's/.*"distinct_ids":\([0-9]*\).*/\1/p' <<<"$load")
wait_for 120 "every id out" verified || fail "verify did not pass within 120 s of a load of $distinct ids" "$worker-1"
ok "20,000 records with 5% re-sent ids: $distinct ids out, verify passes"

# 2. SIGTERM through the engine: exit 0 within the grace.
started=$SECONDS
pm stop -t 30 "$worker-1" >/dev/null
stop_secs=$((SECONDS - started))
code=$(pm inspect --format '{{.State.ExitCode}}' "$worker-1")
[ "$code" = 0 ] || fail "podman stop ended the worker with exit $code" "$worker-1"
[ $stop_secs -lt 30 ] || fail "podman stop took $stop_secs s, the whole grace (SIGKILL)" "$worker-1"
ok "podman stop: exit 0 after ${stop_secs} s"

# 3. The same volume, a new container: the stored index is loaded, nothing is published twice.
containers+=("$worker-2")
"${worker_run[@]}" --name "$worker-2" "$image" >/dev/null
wait_for 180 "healthy" pm healthcheck run "$worker-2" || fail "the second worker did not turn healthy" "$worker-2"
metrics | grep -q '^dedupe_ledger_open_seconds{index="loaded"}' \
  || fail "the second worker did not open the ledger from its stored index: $(metrics | grep '^dedupe_ledger_open_seconds')" "$worker-2"
before=$(out_records)
kcat -b "$brokers" -C -t "$input" -e -q -K $'\t' -f '%k\t%s\n' >"$scratch/input.tsv"
kcat -b "$brokers" -P -t "$input" -K $'\t' <"$scratch/input.tsv"
sent=$(wc -l <"$scratch/input.tsv")
wait_for 120 "the input read" bash -c "[ \"\$(curl -sf http://127.0.0.1:9464/metrics | awk '/^dedupe_consumer_lag_records/ {s += \$2} END {print s + 0}')\" = 0 ]" \
  || fail "the second worker did not read the input sent again" "$worker-2"
after=$(out_records)
[ "$after" = "$before" ] || fail "the input sent again published $((after - before)) records" "$worker-2"
verified >/dev/null || fail "verify fails after the input was sent again" "$worker-2"
ok "a new container on the volume loaded the stored index; the whole input sent again ($sent records) published nothing"

# 4. The ingest container, with Segment's Python library; every event sent twice.
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r tests/python/requirements.txt
containers+=("$worker-ingest")
pm run -d --name "$worker-ingest" --network host --read-only "${ulimits[@]}" --no-healthcheck \
  -e "DEDUPE_KAFKA_BROKERS=$brokers" -e "DEDUPE_INGEST_TOPIC=$input" -e DEDUPE_INGEST_LISTEN=127.0.0.1:18080 \
  -e DEDUPE_METRICS_ADDR=127.0.0.1:19465 -e DEDUPE_WRITE_KEYS=image-check-key=image-check \
  "$image" ingest --config /etc/dedupe/dedupe.toml >/dev/null
wait_for 60 "ingest ready" curl -sf http://127.0.0.1:18080/readyz || fail "the ingest container did not turn ready" "$worker-ingest"
before=$(out_records)
"$venv/bin/python" - <<'EOF' || fail "Segment's Python client could not send its events" "$worker-ingest"
import uuid
from segment.analytics.client import Client
errors = []
ids = [str(uuid.uuid4()) for _ in range(200)]
for attempt in range(2):
    client = Client("image-check-key", host="http://127.0.0.1:18080", sync_mode=True, max_retries=3,
                    on_error=lambda e, batch: errors.append(e))
    for n, message_id in enumerate(ids):
        client.track(user_id=f"user-{n % 7}", event="Image Checked", properties={"n": n}, message_id=message_id)
    client.flush()
if errors:
    raise SystemExit(f"the client reported {errors[:3]}")
EOF
wait_for 120 "the events out" bash -c "[ \$(curl -sf http://127.0.0.1:9464/metrics | awk '/^dedupe_records_out_total/ {s += \$2} END {print s + 0}') -ge $((before + 200)) ]" \
  || fail "the 200 events did not reach the output" "$worker-2"
sleep_until=$((SECONDS + 5)); while [ $SECONDS -lt $sleep_until ]; do sleep 1; done # a repeat would arrive in this time
after=$(out_records)
[ "$after" = $((before + 200)) ] || fail "200 events sent twice published $((after - before)) records" "$worker-2"
verified >/dev/null || fail "verify fails after the front door's events" "$worker-2"
ok "the ingest container took 200 events from analytics-python, each sent twice: 200 out, verify passes"
pm stop -t 30 "$worker-2" "$worker-ingest" >/dev/null

# 5. A root-owned volume: one clear error, not a panic.
mkdir "$scratch/root-owned" && chmod 0755 "$scratch/root-owned"
set +e
refused=$(timeout 120 podman --runtime runc run --rm --network host --read-only "${ulimits[@]}" \
  -v "$scratch/root-owned:/var/lib/dedupe" -e "DEDUPE_KAFKA_BROKERS=$brokers" -e DEDUPE_LOG_FORMAT=human \
  -e "DEDUPE_WORKER_INPUT_TOPIC=$input" -e "DEDUPE_WORKER_OUTPUT_TOPIC=$output" -e DEDUPE_METRICS_ADDR=127.0.0.1:19466 \
  "$image" 2>&1)
code=$?
set -e
[ $code -ne 0 ] && [ $code -ne 124 ] || fail "on a root-owned volume the worker exited $code: $refused"
grep -q panicked <<<"$refused" && fail "on a root-owned volume the worker panicked: $refused"
grep -q '/var/lib/dedupe' <<<"$refused" && grep -q '10001' <<<"$refused" \
  || fail "the error on a root-owned volume names neither the directory nor the uid: $refused"
ok "a root-owned volume: exit $code, $(grep -m1 '/var/lib/dedupe' <<<"$refused" | cut -c1-200)"

echo "image-check: all passed; start to healthy ${healthy_secs} s, podman stop ${stop_secs} s"
