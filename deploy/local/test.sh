#!/usr/bin/env bash
# The whole test suite: unit, property and crash tests, and the integration tests against a real
# Apache Kafka broker (started here with deploy/local/kafka.sh if it is not running).
# A test that cannot reach its broker fails; nothing is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}

deploy/local/kafka.sh up

# Rust: every crate, every test target, with failpoints compiled in for the crash tests.
cargo test --release --workspace --features dedupe-actors/failpoints -- --test-threads="${TEST_THREADS:-2}"
