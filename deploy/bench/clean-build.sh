#!/usr/bin/env bash
# The clean release build, timed against a baseline in the same run: builds two revisions one
# after the other, each from a fresh work tree and an empty target directory (the crates' sources
# are shared, already downloaded), with the command docs/deploying.md gives plus `--timings`.
# Prints per revision the wall time and the slowest units of cargo's timing report, then one JSON
# line: both times and the ratio HEAD / BASE.
#
#   deploy/bench/clean-build.sh BASE [HEAD]    (git revisions; HEAD defaults to HEAD)
#
# BENCH_DIR (default /var/tmp/dedupe-clean-build) keeps the work trees, target directories and
# timing reports (cargo-timing.html) of the last run. Run it on a quiet machine: it takes two clean
# builds' time, about 20 to 40 minutes each on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ $# -ge 1 ] || { echo "usage: $0 BASE [HEAD]" >&2; exit 2; }
base=$(git rev-parse --short "$1")
head=$(git rev-parse --short "${2:-HEAD}")
dir=${BENCH_DIR:-/var/tmp/dedupe-clean-build}
rm -rf "$dir"
mkdir -p "$dir"
cargo fetch --locked >/dev/null

build() {
  local name=$1 rev=$2 tree="$dir/$1"
  git worktree add -f --detach "$tree" "$rev" >/dev/null 2>&1
  local start=$SECONDS
  echo "bench: building $name ($rev) from clean in $tree" >&2
  (cd "$tree" && CARGO_TARGET_DIR="$tree/target" cargo build --release --locked -p dedupe-cli --bin dedupe --timings) \
    >"$dir/$name.log" 2>&1 || { tail -n 30 "$dir/$name.log" >&2; exit 1; }
  echo $((SECONDS - start)) >"$dir/$name.secs"
  cp "$tree/target/cargo-timings/cargo-timing.html" "$dir/$name-timing.html"
  ls -l "$tree/target/release/dedupe" | awk '{print $5}' >"$dir/$name.bytes"
  git worktree remove --force "$tree" >/dev/null 2>&1 || true
}
build base "$base"
build head "$head"

python3 - "$dir" "$base" "$head" <<'PY'
import json, re, sys
d, base, head = sys.argv[1:]
out = {}
for name, rev in (("base", base), ("head", head)):
    html = open(f"{d}/{name}-timing.html").read()
    units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))
    total = float(re.search(r"<td>Total time:</td><td>([0-9.]+)s", html).group(1)) if "Total time" in html else None
    secs = int(open(f"{d}/{name}.secs").read())
    size = int(open(f"{d}/{name}.bytes").read())
    top = sorted(units, key=lambda u: -u["duration"])[:8]
    print(f"bench: {name} {rev}: {secs} s wall ({secs / 60:.1f} min), cargo's total {total} s, binary {size / 1e6:.1f} MB; slowest units:", file=sys.stderr)
    for u in top:
        print(f"bench:   {u['duration']:7.1f} s  {u['name']} {u['version']} {u.get('target', '').strip()}", file=sys.stderr)
    out[name] = {"rev": rev, "wall_secs": secs, "cargo_total_secs": total, "binary_bytes": size,
                 "slowest": [{"unit": f"{u['name']}{u.get('target', '')}", "secs": round(u["duration"], 1)} for u in top]}
out["ratio"] = round(out["head"]["wall_secs"] / out["base"]["wall_secs"], 3)
print(json.dumps(out))
PY
