#!/usr/bin/env bash
# A rolling upgrade and a rollback under load, against the local broker: a release's front door
# and three group-mode workers replaced one at a time by the current build while records flow, then
# rolled back one at a time; each id once and none missing at every step (deploy/local/upgrade.py
# says how). Prints one JSON line per step and a summary line last; exits 1 on any duplicate or
# missing id.
#
#   deploy/local/upgrade.sh [FROM]     FROM: a release of docs/releases.md (default: the last)
#
# Environment:
#   UPGRADE_LIMIT_ON_NEW=1   the current build's workers run under a retention limit (format 4
#                            ledgers), so each rollback meets the old release's documented refusal
#   UPGRADE_KILL=1           SIGKILL worker 0 (the new build) while worker 1 is replaced, each way; it
#                            starts again as it was
#   UPGRADE_MATRIX=1         every release of docs/releases.md in turn (FROM is ignored)
#   DEDUPE_BIN               the current build's binary, when built already (else cargo builds it)
#   UPGRADE_RECORDS, UPGRADE_EVENTS  per step: records into the input, events through the front
#                            door (default 6000 and 2000)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}
releases=$(awk -F'|' '$2 ~ /^ [0-9]+\.[0-9]+ $/ { gsub(/ /, "", $2); print $2 }' docs/releases.md)
last=$(tail -n 1 <<<"$releases")
brokers=$(deploy/local/kafka.sh up | tail -n 1)
# The current build (DEDUPE_BIN: one built already, as the test suite's), copied: a release's build
# replaces the target directory's binary.
if [ -z "${DEDUPE_BIN:-}" ]; then
  cargo build --release --locked -p dedupe-cli --bin dedupe >&2
fi
new=$(mktemp -d)/dedupe
cp "${DEDUPE_BIN:-$CARGO_TARGET_DIR/release/dedupe}" "$new"
to=$("$new" -V | awk '{ print $2 }')

from_list=${1:-$last}
if [ "${UPGRADE_MATRIX:-0}" = 1 ]; then
  from_list=$releases
fi
flags=()
if [ "${UPGRADE_LIMIT_ON_NEW:-0}" = 1 ]; then
  flags+=(--limit-on-new)
fi
if [ "${UPGRADE_KILL:-0}" = 1 ]; then
  flags+=(--kill)
fi
status=0
for from in $from_list; do
  old=$(deploy/local/release-build.sh "$from")
  echo "upgrade.sh: $from -> $to ($old -> $new)" >&2
  python3 deploy/local/upgrade.py --from-version "$from" --to-version "$to" --old "$old" \
    --new "$new" --brokers "$brokers" --kafka-sh deploy/local/kafka.sh \
    --records "${UPGRADE_RECORDS:-6000}" --events "${UPGRADE_EVENTS:-2000}" "${flags[@]}" \
    || status=1
done
rm -rf "$(dirname "$new")"
exit $status
