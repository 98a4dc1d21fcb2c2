#!/usr/bin/env bash
# Checks the deployment files without a container engine or a cluster:
#   - the alert rules and their unit tests, and the Prometheus config (promtool);
#   - the Kubernetes manifests against the Kubernetes schemas, offline (k8s/validate.py, with the
#     schemas bundled by the PyPI package kubernetes-validate, installed into a venv here);
#   - the compose file (docker compose config, or Debian's docker-compose, neither needs an engine).
# Every check runs; the script exits 1 if any failed. A missing tool is installed (Debian packages
# as root, like .ci/run) or fails the run: nothing is skipped.
#
# Environment: DEDUPE_DEPLOY_VENV  the venv for kubernetes-validate (default /var/tmp/dedupe-deploy-venv)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${DEDUPE_DEPLOY_VENV:-/var/tmp/dedupe-deploy-venv}
k8s_validate_version=1.37.0

failed=()
passed=0
step() {
  local name=$1
  shift
  echo "check: $name"
  if "$@"; then
    passed=$((passed + 1))
  else
    echo "check: FAILED $name" >&2
    failed+=("$name")
  fi
}

# Debian packages: prometheus (promtool), docker-compose (the compose check, when the docker CLI
# has no compose plugin).
need_debian() {
  local cmd=$1 package=$2
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "check: installing $package for $cmd"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package"; } >/dev/null \
      || { echo "check: could not install $package" >&2; return 1; }
  fi
  command -v "$cmd" >/dev/null 2>&1 || { echo "check: '$cmd' is missing: apt-get install $package" >&2; return 1; }
}

need_venv() {
  if ! "$venv/bin/python" -c "import kubernetes_validate, yaml" 2>/dev/null; then
    echo "check: installing kubernetes-validate $k8s_validate_version into $venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "kubernetes-validate==$k8s_validate_version" \
      || { echo "check: could not install kubernetes-validate into $venv" >&2; return 1; }
  fi
}

promtool_checks() {
  need_debian promtool prometheus || return 1
  promtool check rules deploy/prometheus/rules.yml \
    && promtool test rules deploy/prometheus/rules.test.yml \
    && promtool check config deploy/prometheus/prometheus.yml
}

k8s_checks() {
  need_venv || return 1
  "$venv/bin/python" deploy/k8s/validate.py deploy/k8s || return 1
  # The PrometheusRule is exactly what the generator makes of rules.yml.
  local copy
  copy=$(mktemp -d)
  cp -r deploy/k8s deploy/prometheus "$copy/"
  mkdir -p "$copy/deploy" && mv "$copy/k8s" "$copy/prometheus" "$copy/deploy/"
  "$copy/deploy/k8s/gen-prometheusrule.sh"
  if ! diff -u deploy/k8s/prometheusrule.yaml "$copy/deploy/k8s/prometheusrule.yaml"; then
    echo "check: deploy/k8s/prometheusrule.yaml is stale: run deploy/k8s/gen-prometheusrule.sh" >&2
    rm -rf "$copy"
    return 1
  fi
  rm -rf "$copy"
}

compose_checks() {
  if docker compose version >/dev/null 2>&1; then
    docker compose -f deploy/compose.yaml config -q
  else
    need_debian docker-compose docker-compose || return 1
    docker-compose -f deploy/compose.yaml config -q
  fi
}

step "promtool: rules, rule unit tests, config" promtool_checks
step "kubernetes: schemas and cross-checks" k8s_checks
step "compose: config" compose_checks

echo "check: $passed passed, ${#failed[@]} failed"
for f in "${failed[@]}"; do echo "check: failed: $f" >&2; done
[ ${#failed[@]} -eq 0 ]
