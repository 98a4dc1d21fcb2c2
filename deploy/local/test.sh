#!/usr/bin/env bash
# The whole test suite: unit, property and crash tests, the integration tests against a real
# Apache Kafka broker (started here with deploy/local/kafka.sh if it is not running), Segment's
# Node, browser (in headless Chromium) and Java libraries against the tracking API, the
# broker-fault tests on a three-node cluster (tests/cluster.rs starts deploy/local/cluster.sh and
# this script stops it when the tests are done), the deployment checks (promtool rule tests, Kubernetes schemas, compose).
# A test that cannot reach its broker fails; nothing is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}

deploy/local/kafka.sh up
# Segment's JavaScript libraries (pinned by tests/js/package-lock.json) for tests/ingest's Node and
# Chromium tests; like the Python venv below, installed here if missing.
tests/js/install.sh

# Rust: every crate and test target, with failpoints compiled into the binary for the crash tests.
cargo test --release --locked --workspace --features dedupe-actors/failpoints -- --test-threads="${TEST_THREADS:-2}"
deploy/local/cluster.sh down

# Lints: clippy on every target, warnings as errors (release: it reuses the compiled C++ above),
# and no unused dependency.
cargo clippy --release --locked --workspace --all-targets --features dedupe-actors/failpoints -- -D warnings
command -v cargo-machete >/dev/null || cargo install --locked cargo-machete
cargo machete

# Python: Segment's own client (segment-analytics-python) against the real `dedupe ingest` and
# worker, in a venv of pinned packages.
venv=${DEDUPE_VENV:-/var/tmp/dedupe-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r tests/python/requirements.txt
DEDUPE_BIN="$CARGO_TARGET_DIR/release/dedupe" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python

# Deployment files: alert rules and their promtool unit tests, Kubernetes schemas, compose.
deploy/check.sh
