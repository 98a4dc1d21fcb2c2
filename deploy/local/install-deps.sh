#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks; does nothing when everything is present.
#
#   deploy/local/install-deps.sh           what building dedupe and running the local broker need
#                                          (deploy/local/demo.sh): the build's and the broker's
#                                          packages, nothing else
#   deploy/local/install-deps.sh --browser that, and Node.js with Segment's JavaScript libraries
#                                          (deploy/local/demo.sh --browser serves analytics.js)
#   deploy/local/install-deps.sh --tests   that, and what the whole test suite needs too (.ci/run,
#                                          deploy/local/test.sh): its Debian packages, the Rust
#                                          test runner and lint, Segment's JavaScript libraries
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tests=0
browser=0
case "${1:-}" in
  "") ;;
  --browser) browser=1 ;;
  --tests) tests=1; browser=1 ;;
  *) echo "install-deps: unknown argument '$1' (--browser or --tests)" >&2; exit 2 ;;
esac

# The build and the broker: libclang-dev (RocksDB's bindings), libssl-dev + pkg-config (rdkafka's
# TLS), maven and a JDK (Apache Kafka's jars and the broker), kcat (the broker readiness check),
# curl (the demo reads the worker's metrics).
packages=(libclang-dev libssl-dev pkg-config maven openjdk-17-jdk-headless kcat curl)
# The test suite: prometheus (promtool and the scrape test), docker-compose (checks the compose
# file; no engine needed), jq (cluster.sh reads kcat's JSON), openssl (the test cluster's CA and
# certificate), iproute2 (its network namespace), chromium (Segment's browser library in a real
# browser, tests/ingest/browser.rs), wrk (the tracking API bench), podman with runc, debootstrap
# and podman-compose (the container image and its tests, deploy/local/image.sh; two packages
# --no-install-recommends leaves out: the dnsname network plugin, which lets compose's services
# find each other by name, and catatonit, the pause process of `podman kube play`'s pods;
# python3-yaml for deploy/k8s/render-pod.py).
if [ "$tests" = 1 ]; then
  packages+=(prometheus docker-compose jq openssl iproute2 chromium wrk podman runc
    golang-github-containernetworking-plugin-dnsname catatonit debootstrap podman-compose python3-yaml)
fi
# Node.js with npm (Segment's JavaScript libraries, below) unless a node is on PATH.
if [ "$browser" = 1 ] && { ! command -v node >/dev/null || ! command -v npm >/dev/null; }; then
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
if [ "$tests" = 1 ]; then
  for tool in cargo-nextest cargo-machete; do
    command -v "$tool" >/dev/null || cargo install --locked "$tool"
  done
  # rustfmt and clippy come with rustup's default profile; a minimal toolchain lacks them.
  for component in rustfmt clippy; do
    cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1 || rustup component add "$component"
  done
fi

# Segment's JavaScript libraries and the browser driver the tests use (from the npm registry).
if [ "$browser" = 1 ]; then
  "$here/../../tests/js/install.sh"
fi
