#!/usr/bin/env bash
# Builds a past release named in docs/releases.md beside the current build and prints the path of
# its binary.
#
#   deploy/local/release-build.sh VERSION       e.g. 0.13
#
# The release's commit is exported (git archive) to $DEDUPE_RELEASES/src-VERSION and built with the
# current build's CARGO_TARGET_DIR: every release since 0.7 uses the same RocksDB and librdkafka
# crates with the same features and profile, so their C and C++ are not compiled again and a
# release takes a few minutes. The binary is kept at $DEDUPE_RELEASES/VERSION/dedupe, where the
# next call finds it; the current build's binary in the target directory, which the release's
# build replaces, is put back.
#
# Environment: DEDUPE_RELEASES (default /var/tmp/dedupe-releases), CARGO_TARGET_DIR (default
# /var/tmp/dedupe-target).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() { echo "release-build.sh: $*" >&2; exit 1; }
version=${1:-}
[ -n "$version" ] || die "usage: release-build.sh VERSION (a version of docs/releases.md)"
releases=${DEDUPE_RELEASES:-/var/tmp/dedupe-releases}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}

# The release's row: | version | commit | date | ... |
commit=$(awk -F'|' -v v="$version" '{ gsub(/ /, "", $2); gsub(/ /, "", $3) } $2 == v { print $3 }' \
  "$root/docs/releases.md")
[ -n "$commit" ] || die "no release '$version' in docs/releases.md"
bin=$releases/$version/dedupe
if [ -x "$bin" ] && [ "$(cat "$releases/$version/commit" 2>/dev/null)" = "$commit" ]; then
  echo "$bin"
  exit 0
fi
git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null \
  || die "release $version's commit $commit is not in this clone's history (clone without --depth)"

src=$releases/src-$version
rm -rf "$src"
mkdir -p "$src"
git -C "$root" archive "$commit" | tar -x -C "$src"
current=$CARGO_TARGET_DIR/release/dedupe
saved=
if [ -f "$current" ]; then
  saved=$(mktemp)
  cp -p "$current" "$saved"
fi
restore() {
  if [ -n "$saved" ]; then
    cp -p "$saved" "$current"
    rm -f "$saved"
  fi
}
trap restore EXIT
echo "release-build.sh: building $version ($commit) in $src" >&2
(cd "$src" && cargo build --release --locked --workspace --bin dedupe >&2)
mkdir -p "$releases/$version"
cp "$current" "$bin.partial"
mv "$bin.partial" "$bin"
echo "$commit" >"$releases/$version/commit"
echo "$bin"
