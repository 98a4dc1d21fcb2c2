#!/usr/bin/env bash
# The whole test suite: unit, property and crash tests, the integration tests against a real
# Apache Kafka broker (started here with deploy/local/kafka.sh if it is not running), Segment's
# Node, browser (in headless Chromium) and Java libraries against the tracking API, the
# broker-fault tests on a three-node cluster (the first of them starts deploy/local/cluster.sh;
# this script stops it when the tests are done), the container image built and run with podman,
# the deployment checks (promtool rule tests, Kubernetes schemas, compose). A test that cannot reach its broker fails; nothing is skipped.
# Each step's time is printed when it ends, and nextest prints every test's at the end of its run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}
# The suite rebuilds the workspace's crates after each change: incremental makes that quick (the
# release profile leaves it off for one-off builds).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-1}
started=$SECONDS
step() { echo "test.sh: $1 done at $((SECONDS - started)) s"; }

# What the suite needs beyond the build (its Debian packages, cargo-nextest, cargo-machete,
# Segment's JavaScript libraries pinned by tests/js/package-lock.json); nothing when present.
deploy/local/install-deps.sh --tests
deploy/local/kafka.sh up
step "setup"

# Formatting first: rustfmt.toml's style, checked in seconds before the long steps.
cargo fmt --all --check
step "format"

# Rust: every crate and test target, with failpoints compiled into the binary for the crash tests
# (cargo builds the binary, with them, before the integration tests of dedupe-cli that start
# it). .config/nextest.toml has the test groups and the timing summary.
trap 'deploy/local/cluster.sh down >/dev/null || true' EXIT
cargo nextest run --release --locked --workspace --features dedupe-actors/failpoints --no-fail-fast
deploy/local/cluster.sh down
step "Rust tests"

# Lints: clippy on every target, warnings as errors (release: it reuses the compiled C++ above),
# and no unused dependency.
cargo clippy --release --locked --workspace --all-targets --features dedupe-actors/failpoints -- -D warnings
cargo machete
step "lints"

# Python: Segment's own client (segment-analytics-python) against the real `dedupe ingest` and
# worker, in a venv of pinned packages. The binary is the one the Rust tests built above. The
# tests' directories (their workers' ledgers, about 7 GB a run) are kept only for
# a failed test.
venv=${DEDUPE_VENV:-/var/tmp/dedupe-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r tests/python/requirements.txt
DEDUPE_BIN="$CARGO_TARGET_DIR/release/dedupe" "$venv/bin/python" -m pytest -q -p no:cacheprovider -o tmp_path_retention_policy=failed tests/python
step "Python tests"

# A rolling upgrade and a rollback under load, from the last release to this build (built beside
# it the first time, then kept in /var/tmp/dedupe-releases), with the binary the Rust tests built;
# then again with a retention limit on this build, so each rollback meets the old release's refusal
# of the new ledger format, and a worker SIGKILLed while another is replaced.
DEDUPE_BIN="$CARGO_TARGET_DIR/release/dedupe" deploy/local/upgrade.sh
DEDUPE_BIN="$CARGO_TARGET_DIR/release/dedupe" UPGRADE_LIMIT_ON_NEW=1 UPGRADE_KILL=1 deploy/local/upgrade.sh
step "upgrade and rollback"

# The container image: built with podman around a release binary without failpoints, then run
# against the local broker (deploy/local/image-check.sh says what each check proves).
deploy/local/image.sh build
deploy/local/image.sh check
# deploy/compose.yaml under podman-compose: up, Prometheus scraping the worker with every alert
# rule loaded, the worker ready, down.
deploy/local/image.sh compose
# The worker's StatefulSet rendered as its first Pod, under podman kube play.
deploy/local/image.sh kube
step "container tests"

# Deployment files: alert rules and their promtool unit tests, Kubernetes schemas, compose.
deploy/check.sh
step "deployment checks"
