#!/usr/bin/env bash
# The container image, built and checked with podman on this machine.
#
#   deploy/local/image.sh build   the runtime stage of deploy/Dockerfile around the binary built
#                                 here (cargo build --release), tagged localhost/dedupe:latest
#   deploy/local/image.sh check   the container tests against the local broker
#                                 (deploy/local/image-check.sh)
#   deploy/local/image.sh compose deploy/compose.yaml under podman-compose with the images of
#                                 deploy/compose.podman.yaml: up, Prometheus scraping the worker
#                                 and holding every alert rule, down
#   deploy/local/image.sh kube    the worker's StatefulSet as one Pod (deploy/k8s/render-pod.py)
#                                 under podman kube play against the local broker, then down
#
# When no registry serves debian:bookworm-slim, the base is made from Debian's own packages with
# debootstrap and cached as a tarball in $DEDUPE_IMAGE_CACHE (/var/tmp/dedupe-image). The image's
# runtime stage is the same Dockerfile text users build; only the stage the binary comes from
# differs (--build-arg BINARY=prebuilt instead of the Rust build stage).
#
# Environment: CARGO_TARGET_DIR (/var/tmp/dedupe-target), DEDUPE_IMAGE (localhost/dedupe:latest),
# DEDUPE_IMAGE_CACHE. Podman runs with runc and lowered ulimits (see docs/deploying.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}
image=${DEDUPE_IMAGE:-localhost/dedupe:latest}
cache=${DEDUPE_IMAGE_CACHE:-/var/tmp/dedupe-image}
base=docker.io/library/debian:bookworm-slim
ulimits=(--ulimit nofile=16384:16384 --ulimit nproc=4096:4096)

die() { echo "image.sh: $*" >&2; exit 1; }
pm() { podman --runtime runc "$@"; }

need() {
  local tool
  for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || die "$tool is not installed (deploy/local/install-deps.sh --tests installs it)"
  done
}

# debian:bookworm-slim from a registry, or else from Debian's packages (about a minute, once).
ensure_base() {
  pm image exists "$base" && return
  if timeout 30 podman pull -q "$base" >/dev/null 2>&1; then return; fi
  local tarball=$cache/debian-bookworm-minbase.tar
  if [ ! -s "$tarball" ]; then
    echo "image.sh: no registry serves $base; making it with debootstrap (cached in $cache)"
    mkdir -p "$cache"
    local root
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 \
      || die "debootstrap failed; its log: $cache/debootstrap.log"
    # As Debian's slim images are: apt keeps no package caches, and there are no downloaded
    # packages, package lists, manuals or docs.
    printf '%s\n' 'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };' \
      'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";' >"$root/etc/apt/apt.conf.d/docker-clean"
    rm -rf "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/man/* "$root"/usr/share/doc/*
    tar -C "$root" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
    rm -rf "$root"
  fi
  pm import -q "$tarball" "$base" >/dev/null || die "podman import of $tarball failed"
}

build() {
  need
  ensure_base
  # The checks drive the image with this machine's dedupe (its loadgen and verify, which the
  # image leaves out): the binary already built here (the test suite's) is kept aside and put
  # back after the image's build replaced it, so that build is the only one. Built when missing.
  local built=$CARGO_TARGET_DIR/release/dedupe kept=$CARGO_TARGET_DIR/dedupe-tools
  "$built" loadgen --help >/dev/null 2>&1 || cargo build --release --locked -p dedupe-cli --bin dedupe
  cp "$built" "$kept"
  # The release binary as the Dockerfile's build stage makes it (no failpoints, no tools: no
  # `bench`, no `loadgen`), stripped, in the build context where the `prebuilt` stage takes it.
  cargo build --release --locked -p dedupe-cli --bin dedupe --no-default-features
  mkdir -p .image
  install -s -m 0755 "$built" .image/dedupe
  echo "image.sh: the image's binary is $(stat -c %s .image/dedupe) bytes, stripped"
  mv "$kept" "$built"
  local started=$SECONDS
  # The docker format keeps the HEALTHCHECK (OCI images have none).
  pm build --format docker --pull=never --network host "${ulimits[@]}" --build-arg BINARY=prebuilt \
    -f deploy/Dockerfile -t "$image" .
  local bytes
  bytes=$(pm image inspect --format '{{.Size}}' "$image")
  echo "image.sh: built $image in $((SECONDS - started)) s: $((bytes / 1000000)) MB"
}

# An image for compose.podman.yaml from deploy/local/containers/NAME.Dockerfile, once.
helper_image() {
  local name=$1 context=$2
  pm image exists "localhost/dedupe-$name:local" && return
  cp "deploy/local/containers/$name.Dockerfile" "$context/Dockerfile"
  pm build -q --format docker --pull=never --network host "${ulimits[@]}" -t "localhost/dedupe-$name:local" "$context" >/dev/null \
    || die "building localhost/dedupe-$name:local failed"
}

# deploy/compose.yaml under podman-compose, with compose.podman.yaml's images: up, checked, down.
compose() {
  need
  command -v podman-compose >/dev/null || die "podman-compose is not installed (deploy/local/install-deps.sh --tests installs it)"
  pm image exists "$image" || die "no image $image: run $0 build first"
  ensure_base
  local context
  context=$(mktemp -d)
  cp -r "$(dirname "$(deploy/local/kafka.sh classpath | cut -d: -f1)")" "$context/libs"
  cp deploy/local/containers/kafka-entry.sh "$context/"
  helper_image kafka "$context"
  rm -rf "$context"/*
  helper_image prometheus "$context"
  rm -rf "$context"
  # podman-compose runs plain `podman`: runc and the lowered limits come from this file.
  # Globals, not locals: the EXIT trap that takes the services down reads them.
  write_conf
  project=dedupe-compose-check
  files=(-p "$project" -f deploy/compose.yaml -f deploy/compose.podman.yaml)
  local services=(kafka topics worker ingest prometheus)
  trap 'CONTAINERS_CONF=$conf podman-compose "${files[@]}" down -v >/dev/null 2>&1 || true' EXIT
  # A network left by an earlier run keeps the plugins it was made with; made anew, it resolves
  # the services' names when the dnsname plugin is installed.
  podman network rm -f "${project}_default" >/dev/null 2>&1 || true
  [ -x /usr/lib/cni/dnsname ] || [ "$(podman info --format '{{.Host.NetworkBackend}}')" = netavark ] \
    || die "podman's networks resolve no names here: install golang-github-containernetworking-plugin-dnsname (deploy/local/install-deps.sh --tests)"
  CONTAINERS_CONF=$conf podman-compose "${files[@]}" up -d "${services[@]}" >"$cache/compose-up.log" 2>&1 \
    || { tail -n 30 "$cache/compose-up.log" >&2; die "podman-compose up failed (its log: $cache/compose-up.log)"; }
  local started=$SECONDS rules targets
  until targets=$(curl -sf http://127.0.0.1:9090/api/v1/targets) && grep -q '"job":"dedupe".*"health":"up"' <<<"$targets"; do
    [ $((SECONDS - started)) -lt 240 ] || { podman logs "${project}_worker_1" 2>&1 | tail -n 20 >&2; die "Prometheus did not scrape the worker within 240 s: $targets"; }
    sleep 2
  done
  echo "image.sh: compose: Prometheus scrapes the worker ($((SECONDS - started)) s after up)"
  rules=$(curl -sf http://127.0.0.1:9090/api/v1/rules)
  local alert
  for alert in $(sed -n 's/^ *- alert: *//p' deploy/prometheus/rules.yml); do
    grep -q "\"name\":\"$alert\"" <<<"$rules" || die "Prometheus did not load the alert $alert"
  done
  echo "image.sh: compose: Prometheus loaded every alert of deploy/prometheus/rules.yml"
  # podman-compose 1.0 starts services in order but does not wait for a dependency's condition:
  # the worker may start before the topics exist, exit, and be restarted (restart: on-failure).
  started=$SECONDS
  until curl -sf http://127.0.0.1:9464/readyz >/dev/null; do
    [ $((SECONDS - started)) -lt 180 ] || { podman logs "${project}_worker_1" 2>&1 | tail -n 20 >&2; die "the worker was not ready behind 127.0.0.1:9464 within 180 s"; }
    sleep 2
  done
  echo "image.sh: compose: the worker is ready; taking the services down"
}

# The runc and ulimit settings for podman commands that take no flags for them (podman-compose,
# podman kube play).
write_conf() {
  conf=$cache/containers.conf
  mkdir -p "$cache"
  printf '[containers]\ndefault_ulimits = ["nofile=16384:16384", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n' >"$conf"
}

# The worker's StatefulSet, rendered as its first Pod (deploy/k8s/render-pod.py), under `podman
# kube play` against the local broker: ready, uid 10001, deduplicating; then down, with the volumes
# kube play made for the ledger's claim and the ConfigMap.
kube() {
  need
  pm image exists "$image" || die "no image $image: run $0 build first"
  ! curl -s -o /dev/null http://127.0.0.1:9464/ || die "port 9464 is taken on this host"
  write_conf
  local run_id
  run_id=$(date +%s)-$$
  kube_input=kube-check-in-$run_id kube_output=kube-check-out-$run_id
  kube_yaml=$(mktemp --suffix=.yaml)
  deploy/local/kafka.sh up >/dev/null
  deploy/local/kafka.sh create-topic "$kube_input" 4 >/dev/null 2>&1
  deploy/local/kafka.sh create-topic "$kube_output" 4 >/dev/null 2>&1
  python3 deploy/k8s/render-pod.py --image "$image" --host-network \
    --env DEDUPE_KAFKA_BROKERS=127.0.0.1:9092 --env "DEDUPE_WORKER_INPUT_TOPIC=$kube_input" \
    --env "DEDUPE_WORKER_OUTPUT_TOPIC=$kube_output" --env "DEDUPE_WORKER_GROUP_ID=kube-check-$run_id" \
    --env DEDUPE_METRICS_ADDR=127.0.0.1:9464 >"$kube_yaml"
  trap 'CONTAINERS_CONF=$conf podman kube down "$kube_yaml" >/dev/null 2>&1 || true; podman volume rm -f ledger-dedupe-worker-0 dedupe-config >/dev/null 2>&1 || true; rm -f "$kube_yaml"' EXIT
  CONTAINERS_CONF=$conf podman kube play "$kube_yaml" >"$cache/kube-play.log" 2>&1 \
    || { cat "$cache/kube-play.log" >&2; die "podman kube play failed"; }
  local started=$SECONDS
  until curl -sf http://127.0.0.1:9464/readyz >/dev/null; do
    [ $((SECONDS - started)) -lt 180 ] || { podman logs dedupe-worker-0-worker 2>&1 | tail -n 20 >&2; die "the pod's worker was not ready within 180 s"; }
    sleep 1
  done
  echo "image.sh: kube: the StatefulSet's pod is ready $((SECONDS - started)) s after kube play"
  local uids
  uids=$(podman exec dedupe-worker-0-worker awk '/^Uid:/ {print $2, $3, $4, $5}' /proc/1/status)
  [ "$uids" = "10001 10001 10001 10001" ] || die "the pod's worker runs as uids $uids"
  local dedupe=$CARGO_TARGET_DIR/release/dedupe
  "$dedupe" loadgen --brokers 127.0.0.1:9092 --topic "$kube_input" --count 10000 --dup-ratio 0.05 >/dev/null
  started=$SECONDS
  until "$dedupe" verify --brokers 127.0.0.1:9092 --input-topic "$kube_input" --output-topic "$kube_output" --timeout-secs 20 >/dev/null 2>&1; do
    [ $((SECONDS - started)) -lt 120 ] || die "verify did not pass within 120 s"
    sleep 1
  done
  echo "image.sh: kube: as uid 10001, 10,000 records with 5% re-sent ids deduplicated, verify passes; taking the pod down"
}

case "${1:-}" in
  build) build ;;
  check) need; exec deploy/local/image-check.sh ;;
  compose) compose ;;
  kube) kube ;;
  *) echo "usage: $0 build|check|compose|kube" >&2; exit 2 ;;
esac
