#!/usr/bin/env bash
# Writes the past formats' fixtures that cli/tests/past_formats.rs reads: for each release, what
# its own worker wrote for a fixed list of ids, and the verdict it gave each id's next copy.
#
#   deploy/local/fixtures.sh [VERSION ...]     default: every release in docs/releases.md
#
# Per release (built by deploy/local/release-build.sh), against the local broker
# (deploy/local/kafka.sh up), on topics of its own with one partition:
#   1. its worker takes in a UUID, a text id, a JSON number (with a `json:/id` id source, from 0.8;
#      the number's text as the key before), and, from 0.9 (which has `dedupe forget`), an id it
#      is then asked to forget and one forgotten and sent again; and one copy, which it drops;
#   2. stopped, it checkpoints its ledger (`dedupe ledger snapshot`): the ledger directory and the
#      snapshot are kept, without RocksDB's info logs, the id index and RocksDB's options files
#      gzipped;
#   3. started again, it gets a copy of every id, one id never sent and a last new id: which copies
#      it published is each id's verdict;
#   4. its id changelog (each record as a 4-byte big-endian length and its bytes) and its audit
#      (one JSON record a line), read committed, are kept.
#   5. from 0.8, a second worker does the same with composite ids (`composite_fixture` below),
#      kept in composite/.
# Everything goes to cli/tests/fixtures/formats/VERSION/, with fixture.json naming the release,
# the id source, and each id's kind and verdict.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
die() { echo "fixtures.sh: $*" >&2; exit 1; }
command -v kcat >/dev/null || die "kcat is not installed (deploy/local/install-deps.sh)"
brokers=$(deploy/local/kafka.sh up | tail -n 1)
out_root=cli/tests/fixtures/formats

# The versions of docs/releases.md's table, oldest first.
all_versions() {
  awk -F'|' '$2 ~ /^ [0-9]+\.[0-9]+ $/ { gsub(/ /, "", $2); print $2 }' docs/releases.md
}

# Whether release $1 (major.minor, 0.x) is at least 0.$2.
at_least() {
  local minor=${1#0.}
  [ "$minor" -ge "$2" ]
}

# Reads topic $1 from the beginning, read committed, in kcat's format $2.
read_topic() {
  kcat -C -b "$brokers" -t "$1" -o beginning -e -q -X isolation.level=read_committed -f "$2"
}

# What the release did with the copy keyed $1 of its last run: published if the output keys
# read after it ($published) name it, else dropped.
verdict_of() {
  if grep -qxF "$1" <<<"$published"; then echo published; else echo dropped; fi
}

# Waits until the output topic holds a record keyed $1 (20 s at most).
wait_for_key() {
  local deadline=$((SECONDS + 20))
  until read_topic "$output" '%k\n' | grep -qxF "$1"; do
    [ $SECONDS -lt $deadline ] || die "$version: no output record keyed '$1' after 20 s (see $run/worker.log)"
    sleep 0.5
  done
}

worker=
# A worker left running by a failed step is stopped on the way out.
trap '[ -z "$worker" ] || kill "$worker" 2>/dev/null || true' EXIT

start_worker() {
  "$bin" run --config "$run/dedupe.toml" >>"$run/worker.log" 2>&1 &
  worker=$!
  local deadline=$((SECONDS + 30))
  until curl -sf "http://$metrics/readyz" >/dev/null 2>&1; do
    kill -0 "$worker" 2>/dev/null || die "$version: the worker exited at start (see $run/worker.log)"
    [ $SECONDS -lt $deadline ] || die "$version: the worker was not ready after 30 s (see $run/worker.log)"
    sleep 0.3
  done
}

stop_worker() {
  kill -TERM "$worker"
  wait "$worker" || die "$version: the worker did not stop cleanly (see $run/worker.log)"
  worker=
}

# Sends one record keyed by id $1 whose value's "id" is the JSON text $2.
send() {
  printf '%s\t{"id":%s,"n":%s}\n' "$1" "$2" "$RANDOM" | kcat -P -b "$brokers" -t "$input" -K $'\t'
}

fixture() {
  version=$1
  bin=$(deploy/local/release-build.sh "$version")
  commit=$(cat "$(dirname "$bin")/commit")
  run=$(mktemp -d)
  local tag
  tag=$(echo "$version" | tr . -)-$(date +%s)
  input=fixtures.$tag.in
  output=fixtures.$tag.out
  metrics=127.0.0.1:$((20000 + RANDOM % 20000))
  deploy/local/kafka.sh create-topic "$input" 1 >/dev/null
  deploy/local/kafka.sh create-topic "$output" 1 >/dev/null
  local id_source=key number_kind=key
  if at_least "$version" 8; then
    id_source=json:/id
    number_kind=json_number
  fi
  cat >"$run/dedupe.toml" <<TOML
[kafka]
brokers = "$brokers"
[worker]
input_topic = "$input"
output_topic = "$output"
data_dir = "$run/ledger"
id_source = "$id_source"
promised_window_secs = 3600
[ledger]
budget_bytes = "256MiB"
write_buffer_bytes = "4MiB"
[snapshots]
dir = "$run/snapshots"
[metrics]
addr = "$metrics"
TOML
  # kind|id|the value's "id" as JSON
  local ids=(
    "text|6ba7b810-9dad-41d1-80b4-00c04fd430c8|\"6ba7b810-9dad-41d1-80b4-00c04fd430c8\""
    "text|order-7|\"order-7\""
    "$number_kind|12345678901234567890|12345678901234567890"
  )
  local forgets=0
  if at_least "$version" 9; then
    ids+=("text|forget-me|\"forget-me\"" "text|resent-me|\"resent-me\"")
    forgets=1
  fi

  echo "fixtures.sh: $version: taking the ids in" >&2
  start_worker
  local entry kind id json
  for entry in "${ids[@]}"; do
    IFS='|' read -r kind id json <<<"$entry"
    send "$id" "$json"
  done
  send order-7 '"order-7"'
  send first-done '"first-done"'
  wait_for_key first-done
  if [ "$forgets" = 1 ]; then
    "$bin" forget --config "$run/dedupe.toml" --partition 0 forget-me resent-me >>"$run/worker.log" 2>&1 \
      || die "$version: dedupe forget failed (see $run/worker.log)"
    send resent-me '"resent-me"'
    send second-done '"second-done"'
    wait_for_key second-done
  fi
  stop_worker
  "$bin" ledger snapshot --config "$run/dedupe.toml" >>"$run/worker.log" 2>&1 \
    || die "$version: dedupe ledger snapshot failed (see $run/worker.log)"

  local dest=$out_root/$version
  rm -rf "$dest"
  mkdir -p "$dest"
  cp -r "$run/ledger" "$dest/ledger"
  cp -r "$(find "$run/snapshots" -mindepth 1 -maxdepth 1 -type d -name 'ledger-*' | head -n 1)" \
    "$dest/snapshot"
  find "$dest" -name 'LOG*' -delete
  # The id index is a table sized for the budget, mostly empty: kept compressed (the test expands
  # it), as are RocksDB's options files.
  find "$dest" \( -name id-index -o -name 'OPTIONS-*' \) -exec gzip -9 -n {} +

  echo "fixtures.sh: $version: asking each id's verdict" >&2
  local published_before
  published_before=$(read_topic "$output" '%k\n' | wc -l)
  start_worker
  ids+=("text|never-sent|\"never-sent\"")
  for entry in "${ids[@]}"; do
    IFS='|' read -r kind id json <<<"$entry"
    send "$id" "$json"
  done
  send last-done '"last-done"'
  wait_for_key last-done
  stop_worker
  local published
  published=$(read_topic "$output" '%k\n' | tail -n +"$((published_before + 1))")

  read_topic "$output.ids" '%R%s' >"$dest/changelog.bin"
  read_topic "$output.duplicates" '%s\n' >"$dest/audit.jsonl"
  {
    printf '{\n  "version": "%s",\n  "commit": "%s",\n  "id_source": "%s",\n  "ids": [\n' \
      "$version" "$commit" "$id_source"
    local n=0
    for entry in "${ids[@]}"; do
      IFS='|' read -r kind id json <<<"$entry"
      [ $n -eq 0 ] || printf ',\n'
      printf '    {"id": "%s", "kind": "%s", "verdict": "%s"}' "$id" "$kind" "$(verdict_of "$id")"
      n=$((n + 1))
    done
    printf '\n  ]\n}\n'
  } >"$dest/fixture.json"
  rm -rf "$run"
  if at_least "$version" 8; then
    composite_fixture "$dest/composite"
  fi
  echo "fixtures.sh: $version: $(du -sk "$dest" | cut -f1) KiB in $dest" >&2
}

# Composite ids (from 0.8): a worker reading ["json:/user", "json:/n"] takes in three ids, a text
# and a small number, a text and a number past 64 bits, two texts; one copy of the first comes a
# second and a half later, which refreshes it from 0.12 (ledger.refresh_on_duplicate). Its ledger
# is kept in $1 with each record and the verdict its next copy got.
composite_fixture() {
  local dest=$1
  run=$(mktemp -d)
  local tag
  tag=$(echo "$version" | tr . -)-composite-$(date +%s)
  input=fixtures.$tag.in
  output=fixtures.$tag.out
  deploy/local/kafka.sh create-topic "$input" 1 >/dev/null
  deploy/local/kafka.sh create-topic "$output" 1 >/dev/null
  local refresh=false
  if at_least "$version" 12; then refresh=true; fi
  cat >"$run/dedupe.toml" <<TOML
[kafka]
brokers = "$brokers"
[worker]
input_topic = "$input"
output_topic = "$output"
data_dir = "$run/ledger"
id_source = ["json:/user", "json:/n"]
promised_window_secs = 3600
[ledger]
budget_bytes = "256MiB"
write_buffer_bytes = "4MiB"
TOML
  if [ "$refresh" = true ]; then
    sed -i 's/^\[ledger\]$/[ledger]\nrefresh_on_duplicate = true/' "$run/dedupe.toml"
  fi
  cat >>"$run/dedupe.toml" <<TOML
[metrics]
addr = "$metrics"
TOML
  # key|value
  local records=(
    'alice|{"user":"alice","n":1}'
    'bob|{"user":"bob","n":12345678901234567890}'
    'carol|{"user":"carol","n":"x"}'
  )
  local entry key value
  start_worker
  for entry in "${records[@]}"; do
    IFS='|' read -r key value <<<"$entry"
    printf '%s\t%s\n' "$key" "$value" | kcat -P -b "$brokers" -t "$input" -K $'\t'
  done
  sleep 1.5
  printf 'alice\t{"user":"alice","n":1}\nfirst-done\t{"user":"first-done","n":0}\n' \
    | kcat -P -b "$brokers" -t "$input" -K $'\t'
  wait_for_key first-done
  stop_worker
  mkdir -p "$dest"
  cp -r "$run/ledger" "$dest/ledger"
  find "$dest" -name 'LOG*' -delete
  find "$dest" \( -name id-index -o -name 'OPTIONS-*' \) -exec gzip -9 -n {} +
  local published_before published
  published_before=$(read_topic "$output" '%k\n' | wc -l)
  start_worker
  records+=('dave|{"user":"dave","n":2}')
  for entry in "${records[@]}" 'last-done|{"user":"last-done","n":0}'; do
    IFS='|' read -r key value <<<"$entry"
    printf '%s\t%s\n' "$key" "$value" | kcat -P -b "$brokers" -t "$input" -K $'\t'
  done
  wait_for_key last-done
  stop_worker
  published=$(read_topic "$output" '%k\n' | tail -n +"$((published_before + 1))")
  {
    printf '{\n  "id_source": ["json:/user", "json:/n"],\n  "refresh_on_duplicate": %s,\n  "records": [\n' "$refresh"
    local n=0
    for entry in "${records[@]}"; do
      IFS='|' read -r key value <<<"$entry"
      [ $n -eq 0 ] || printf ',\n'
      # The value as a JSON string, byte for byte as it was sent.
      printf '    {"key": "%s", "value": "%s", "verdict": "%s"}' "$key" "${value//\"/\\\"}" \
        "$(verdict_of "$key")"
      n=$((n + 1))
    done
    printf '\n  ]\n}\n'
  } >"$dest/fixture.json"
  rm -rf "$run"
}

versions=("$@")
[ ${#versions[@]} -gt 0 ] || mapfile -t versions < <(all_versions)
for v in "${versions[@]}"; do
  fixture "$v"
done
