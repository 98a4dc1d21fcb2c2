#!/usr/bin/env bash
# Installs Segment's JavaScript libraries and the browser driver the tests use, exactly as
# package-lock.json pins them, from the npm registry into tests/js/node_modules (ignored by git);
# does nothing when the lock file has not changed since the last install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
command -v npm >/dev/null || { echo "tests/js/install.sh: npm is not installed (deploy/local/install-deps.sh installs it)" >&2; exit 1; }
if ! cmp -s package-lock.json node_modules/.dedupe-installed-lock 2>/dev/null; then
  echo "tests/js: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.dedupe-installed-lock
fi
