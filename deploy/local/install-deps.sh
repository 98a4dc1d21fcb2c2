#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build dedupe and run its local broker and tests.
# Used by .ci/run and deploy/local/demo.sh; does nothing when everything is present.
set -euo pipefail

# Debian packages: libclang-dev (RocksDB's bindings), libssl-dev + pkg-config (rdkafka's TLS),
# kcat (the broker readiness check), curl (the demo), prometheus (promtool and the scrape test), docker-compose
# (checks the compose file; no engine needed), maven and a JDK (Apache Kafka's jars; the JDK's source
# launcher runs tests/java's client of Segment's Java library), jq (cluster.sh
# reads kcat's JSON), openssl (the test cluster's CA and certificate), iproute2 (its network namespace),
# chromium (Segment's browser library in a real browser, tests/ingest/browser.rs), wrk (the tracking
# API bench), podman with runc, debootstrap and podman-compose (the container image and its tests,
# deploy/local/image.sh; two packages --no-install-recommends leaves out: the dnsname network
# plugin, which lets compose's services find each other by name, and catatonit, the pause process
# of `podman kube play`'s pods; python3-yaml for deploy/k8s/render-pod.py), and Node.js with npm (Segment's JavaScript libraries, below) unless a node
# is on PATH.
packages=(libclang-dev libssl-dev pkg-config kcat curl prometheus docker-compose maven openjdk-17-jdk-headless jq openssl iproute2
  chromium wrk podman runc golang-github-containernetworking-plugin-dnsname catatonit debootstrap podman-compose python3-yaml)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A JDK and Maven installed outside Debian's packages serve as well.
if command -v javac >/dev/null && command -v mvn >/dev/null; then
  missing=("${missing[@]/openjdk-17-jdk-headless}")
  missing=("${missing[@]/maven}")
fi
read -r -a missing <<<"${missing[*]}"
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Rust test runner (deploy/local/test.sh runs the Rust tests with cargo-nextest) and the
# unused-dependency lint, from crates.io.
for tool in cargo-nextest cargo-machete; do
  command -v "$tool" >/dev/null || cargo install --locked "$tool"
done

# Segment's JavaScript libraries and the browser driver the tests use (from the npm registry).
"$(dirname "${BASH_SOURCE[0]}")/../../tests/js/install.sh"
