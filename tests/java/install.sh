#!/usr/bin/env bash
# Resolves Segment's Java library (analytics-java, pinned by pom.xml) from Maven Central and
# writes its runtime classpath to the file it prints; does nothing when pom.xml has not changed
# since the last run. The jars stay in Maven's own repository (~/.m2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
command -v mvn >/dev/null || { echo "tests/java/install.sh: Maven is not installed (deploy/local/install-deps.sh installs it)" >&2; exit 1; }
cache=${DEDUPE_CACHE:-$HOME/.cache/dedupe}
out="$cache/segment-java-client-$(sha256sum pom.xml | cut -c1-12).classpath"
if [ ! -s "$out" ]; then
  mkdir -p "$cache"
  mvn -B -q -f pom.xml dependency:build-classpath -Dmdep.outputFile="$out.tmp" >"$cache/segment-java-client-mvn.log" 2>&1 \
    || { cat "$cache/segment-java-client-mvn.log" >&2; echo "tests/java/install.sh: Maven could not resolve analytics-java" >&2; exit 1; }
  mv "$out.tmp" "$out"
fi
echo "$out"
