#!/usr/bin/env python3
"""Renders the figures tables of docs/performance.md and docs/testing.md from the benches' JSON.

    deploy/bench/figures.py           rewrite both tables in place
    deploy/bench/figures.py --check   change nothing; exit 1 naming every difference

Where the figures come from: docs/bench/, one file per bench or group of runs.
- Raw output: the last line a bench printed with `--json`, verbatim, either alone (handoff.json,
  which plot.py draws) or wrapped as {"command", "date", "machine", "result": <that line>}, or
  several such wrappers under "runs"; ingest.jsonl holds deploy/bench/ingest.sh's lines as printed.
- Transcribed: a file with "transcribed_from" holds figures the docs recorded for runs too long to
  repeat on every change (a billion ids, 200M-id moves, the fault tests on the three-node cluster).
  They are not raw output, and the table's last column says so.

ROWS below says, per bench or fault: its name, the doc section with its method, the JSON file, the
figure made from that file, the target, whether the figure meets it (where a script can tell), and
the README's phrase, if the README states the figure.

The table sits between `<!-- figures:begin -->` and `<!-- figures:end -->` in each doc; this
script owns what is between them.

--check fails when:
- a doc's table differs from what this script renders from docs/bench/ (run the script, commit);
- a doc has more than 5 dated lines (a date such as 2026-12-03, or 12-03 alone, outside its code
  blocks): dated runs belong in CHANGELOG.md, and a range such as "10 to 14 s" reads as one too
  when written with a hyphen, so write such ranges another way;
- the README disagrees with the tables. The README's "## Headline figures" section must contain,
  word for word, every phrase the rows render for it (so a run that changes a figure fails the
  check until the README says the same), and every number in that section must stand inside one
  of those phrases (so a figure edited in the README alone, or added there without a row, fails).
  Line breaks count as spaces there, and link targets are left out of the count;
- README.md, docs/operations.md or docs/architecture.md states a measured figure that is not what
  docs/bench/ renders: each such figure is a CLAIMS phrase the page must contain word for word, and
  every other number with a measurement's unit in those pages' prose (bytes per id, ids/s, msgs/s,
  seconds, minutes, MB...) must stand inside a claim, a headline phrase, or a NOT_MEASURED phrase
  (a setting, a default or arithmetic on them, each with its reason). Figures with no bench to
  run them (the demo's and the build's minutes) are measurements recorded in docs/bench/build.json.
Python 3.11, standard library only.
"""

import json
import pathlib
import re
import statistics
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Callable, Optional

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "bench"
BEGIN = "<!-- figures:begin -->"
END = "<!-- figures:end -->"
MAX_DATED_LINES = 5
DATE = re.compile(r"(?<![\d.])(?:20\d\d-)?(?:0[1-9]|1[0-2])-[0-3]\d(?!\d)")
NUMBER = re.compile(r"(?<![A-Za-z_\d.])\d+(?:[.,]\d+)*")  # not the 99 of p99


class Missing(Exception):
    """A bench file, or a field of it, that a row needs."""


# ---------------------------------------------------------------------------------------------
# Reading the files


@dataclass
class Source:
    name: str
    data: object
    transcribed: bool

    def result(self, run: Optional[str] = None):
        """The bench's own JSON: the whole file, its "result", or the named run's."""
        data = self.data
        if run is not None:
            try:
                data = data["runs"][run]
            except (KeyError, TypeError):
                raise Missing(f"docs/bench/{self.name} has no run {run!r}")
        if isinstance(data, dict) and "result" in data:
            return data["result"]
        return data

    def command(self, run: Optional[str] = None) -> Optional[str]:
        data = self.data["runs"][run] if run is not None else self.data
        return data.get("command") if isinstance(data, dict) else None


_loaded: dict = {}


def source(name: str) -> Source:
    if name not in _loaded:
        path = BENCH / name
        if not path.exists():
            raise Missing(f"docs/bench/{name} does not exist")
        text = path.read_text()
        try:
            if name.endswith(".jsonl"):
                data = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                data = json.loads(text)
        except json.JSONDecodeError as e:
            raise Missing(f"docs/bench/{name} is not JSON: {e}")
        transcribed = isinstance(data, dict) and "transcribed_from" in data
        _loaded[name] = Source(name, data, transcribed)
    return _loaded[name]


def field(data, *path):
    for key in path:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            raise Missing(f"no field {'.'.join(map(str, path))}")
    return data


# ---------------------------------------------------------------------------------------------
# Formatting: half up, so 1.135 reads 1.14 whatever the float holds


def num(x, places: int = 2) -> str:
    q = Decimal(1).scaleb(-places)
    return str(Decimal(repr(float(x))).quantize(q, rounding=ROUND_HALF_UP))


def whole(x) -> str:
    return f"{int(Decimal(repr(float(x))).quantize(Decimal(1), rounding=ROUND_HALF_UP)):,}"


def millions(x, places: int = 2) -> str:
    return f"{num(x / 1e6, places)}M"


def thousands(x) -> str:
    return f"{whole(x / 1e3)}k"


def mb(x) -> str:
    return f"{whole(x / 1e6)} MB"


def gb(x, places: int = 2) -> str:
    return f"{num(x / 1e9, places)} GB"


def kspan(values) -> str:
    """Thousands, "256-284k"."""
    lo, hi = whole(min(values) / 1e3), whole(max(values) / 1e3)
    return f"{lo}k" if lo == hi else f"{lo}-{hi}k"


def span(values, fmt=lambda v: num(v, 1)) -> str:
    """"a-b" for the smallest and largest, or one figure when they are equal."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def percent(x) -> str:
    return f"{num(x * 100, 1)}%"


# ---------------------------------------------------------------------------------------------
# The rows


@dataclass
class Figure:
    cell: str
    met: Optional[bool] = None
    readme: Optional[str] = None


@dataclass
class Row:
    doc: str  # "performance" or "testing"
    name: str
    method: str
    section: str  # anchor in the same doc
    file: str
    target: str
    figure: Callable[[Source], Figure]
    command: Optional[str] = None  # else the command the file carries
    run: Optional[str] = None  # the run whose command the file carries


def pipeline(s: Source) -> Figure:
    r = s.result()
    ratio, dd, pp = r["ratio"], r["dedupe_msgs_per_sec"], r["passthrough_msgs_per_sec"]
    p99 = r["p99_ms"] / r["passthrough_p99_ms"]
    return Figure(
        f"{num(ratio)} of the pass-through's throughput ({whole(dd)} against {whole(pp)} msgs/s); "
        f"p50 / p99 {whole(r['p50_ms'])} / {whole(r['p99_ms'])} ms against "
        f"{whole(r['passthrough_p50_ms'])} / {whole(r['passthrough_p99_ms'])} ms ({num(p99)}×)",
        met=ratio >= 0.95 and p99 <= 1.5,
        readme=f"{num(ratio)} of its throughput ({thousands(dd)} against {thousands(pp)} msgs/s), "
        f"p99 {num(p99)}× its p99",
    )


def handoff(runs, readme: Callable[[dict], str], limit: float):
    """One run (a name), or several in a row (a list): the slowest is shown, and the target is
    met only if every run meets it."""
    names = [runs] if isinstance(runs, str) else runs

    def figure(s: Source) -> Figure:
        results = [s.result(n) for n in names]
        r = max(results, key=lambda x: x["handover_ready_secs"])
        sent = sum(x["old_duplicates_sent"] for x in results)
        published = sum(x["old_duplicates_published"] for x in results)
        firsts = ", ".join(f"{num(x['handover_ready_secs'])} s" for x in results)
        lead = (f"first publish after the assignment in {len(results)} runs in a row: {firsts}; the slowest's window back"
                if len(results) > 1 else f"first publish {num(r['handover_ready_secs'])} s after the assignment, the window back")
        return Figure(
            f"{lead} at {num(r['window_restored_secs'])} s ({whole(r['window_before_secs'])} s before, "
            f"{whole(r['window_after_secs'])} s after); {published} of {sent:,} old duplicates published",
            met=all(x["handover_ready_secs"] <= limit for x in results) and published == 0,
            readme=readme(r),
        )

    return figure


def moves(s: Source) -> Figure:
    """The group's part of a move: from the old owner's signal to the new owner's assignment."""
    term, static, kill = (s.result(n) for n in ("sigterm", "static", "sigkill"))
    return Figure(
        f"assignment {num(term['assignment_secs'])} s after a SIGTERM (first publish at "
        f"{num(term['stop_to_first_publish_secs'])} s); static members {num(static['assignment_secs'])} s; "
        f"after a SIGKILL {num(kill['assignment_secs'])} s",
        met=term["assignment_secs"] <= 2 and all(
            r["old_duplicates_published"] == 0 for r in (term, static, kill)),
    )


def move_secs(run: str) -> str:
    return num(source("handoff-moves.json").result(run)["assignment_secs"])


def ledger(with_baselines: bool, readme: Optional[Callable[[dict], str]] = None):
    def figure(s: Source) -> Figure:
        r = s.result()
        parts = [f"{millions(r['ids_per_sec'])} ids/s"]
        met = r["ids_per_sec"] >= 1e6
        if with_baselines:
            base = r["baseline_keys"]
            on = "" if base == r["keys"] else f" on its first {millions(base, 0)} ids"
            parts[0] += (
                f", {num(r['ratio_vs_segment'], 1)}× Segment's design"
                f" ({millions(r['baseline_segment_design_ids_per_sec'])}{on}), "
                f"HashSet {millions(r['baseline_hashset_ids_per_sec'])}"
            )
            met = met and r["ratio_vs_segment"] >= 5
        parts.append(f"{num(r['bytes_per_key'], 1)} bytes per id")
        parts.append(f"peak RSS {gb(r['peak_rss_bytes'])}")
        parts.append(f"slowest batch {whole(r['max_batch_ms'])} ms")
        if r.get("crash_reopen_secs") is not None:
            parts.append(
                f"reopen {num(r['reopen_secs'])} s, from a checkpoint {num(r['crash_reopen_secs'], 1)} s, "
                f"rebuilt {num(r['rebuild_secs'], 1)} s"
            )
        met = met and r["bytes_per_key"] <= 20 and r["peak_rss_bytes"] <= 2 * 2**30
        return Figure("; ".join(parts), met=met, readme=readme(r) if readme else None)

    return figure


def aging(s: Source) -> Figure:
    r = s.result()
    share = r["aged_ids_per_sec"] / r["unaged_ids_per_sec"]
    return Figure(
        f"aged {millions(r['aged_ids_per_sec'])} against un-aged {millions(r['unaged_ids_per_sec'])} "
        f"ids/s ({percent(share)}); disk at most {mb(r['max_disk_bytes'])} of "
        f"{mb(r['disk_limit_bytes'])} allowed; {num(r['bytes_per_key'], 1)} bytes per id",
        met=share >= 0.9 and r["max_disk_bytes"] <= r["disk_limit_bytes"],
    )


def billion(s: Source) -> Figure:
    r = s.result("1b")
    met = (
        r["ids_per_sec"] >= 1e6
        and r["bytes_per_key"] <= 18
        and r["max_batch_ms"] <= 1000
        and r["reopen_secs"] <= 5
        and r["rebuild_secs"] >= 2 * r["crash_reopen_secs"]
    )
    return Figure(
        f"{millions(r['ids_per_sec'])} ids/s, {num(r['bytes_per_key'])} bytes per id, slowest batch "
        f"{whole(r['max_batch_ms'])} ms, reopen {num(r['reopen_secs'])} s ({r['reopen_index']}), from a "
        f"checkpoint {num(r['crash_reopen_secs'], 1)} s against rebuilt {num(r['rebuild_secs'], 1)} s, "
        f"peak RSS {gb(r['peak_rss_bytes'])}; {r['duplicates_found']:,} of "
        f"{r['duplicates_expected']:,} re-sent ids found",
        met=met,
        readme=f"at a billion ids {millions(r['ids_per_sec'])} ids/s and a reopen in "
        f"{num(r['reopen_secs'])} s",
    )


def billion_aging(s: Source) -> Figure:
    runs = field(s.data, "runs", "1b-aging", "results")
    shares = [r["aged_share"] for r in runs]
    r = runs[0]
    return Figure(
        f"aged {' and '.join(percent(x) for x in shares)} of un-aged in {len(runs)} runs; "
        f"{num(r['bytes_per_key'], 1)} bytes per id; disk {gb(r['max_disk_bytes'])} of "
        f"{gb(r['disk_limit_bytes'])} allowed",
        met=min(shares) >= 0.9 and all(x["max_disk_bytes"] <= x["disk_limit_bytes"] for x in runs),
    )


def digests(s: Source) -> Figure:
    without, with_ = s.result("without"), s.result("with")
    return Figure(
        f"{num(with_['bytes_per_key'], 1)} bytes per id with digests against "
        f"{num(without['bytes_per_key'], 1)} without; {millions(with_['ids_per_sec'])} against "
        f"{millions(without['ids_per_sec'])} ids/s",
        readme=f"({num(with_['bytes_per_key'] - without['bytes_per_key'], 1)} more with content digests)",
    )


def refresh(s: Source) -> Figure:
    """Refresh on against off at 1% and 10% re-sent: each round's ids/s, the ids refreshed, and
    the ledger's files."""
    def at(dup: str) -> str:
        off, on = s.data["runs"][f"off-{dup}"], s.data["runs"][f"on-{dup}"]
        rate = lambda run: span([r["ids_per_sec"] for r in run["rounds"]], lambda v: millions(v))
        return (f"at {dup} re-sent, {rate(on)} ids/s with refresh ({whole(on['result']['refreshed_ids'])} ids "
                f"refreshed) against {rate(off)} without, {mb(on['result']['live_sst_bytes'])} against "
                f"{mb(off['result']['live_sst_bytes'])} of files")
    return Figure(f"{at('1%')}; {at('10%')}")


def rekey(s: Source) -> Figure:
    r = s.result()
    return Figure(
        f"{thousands(r['rekey_records_per_sec'])} records/s re-keyed by a JSON field, "
        f"{num(r['ratio'])} of the pass-through copy's {thousands(r['passthrough_records_per_sec'])}",
    )


def opening(s: Source) -> Figure:
    sizes = s.result()
    sizes = sizes["sizes"] if isinstance(sizes, dict) else sizes
    empty = next(r for r in sizes if r["ids"] == 0)
    full = max(sizes, key=lambda r: r["ids"])
    met = (
        empty["first_open_secs"] <= 1
        and empty["rss_after_open_bytes"] <= 300e6
        and empty["close_secs"] <= 1
        and empty["disk_bytes"] <= 50e6
        and full["close_secs"] <= 2
        and full["index_file_bytes"] <= 200e6
        and full["reopen_secs"] <= 1
    )
    return Figure(
        f"empty: open {num(empty['first_open_secs'], 3)} s, {mb(empty['rss_after_open_bytes'])} "
        f"resident, close {'under 1 ms' if empty['close_secs'] < 0.0005 else num(empty['close_secs'], 3) + ' s'}, {num(empty['disk_bytes'] / 1e6, 1)} MB on "
        f"disk; {millions(full['ids'], 0)} ids: close {num(full['close_secs'])} s, index file "
        f"{mb(full['index_file_bytes'])}, reopen {num(full['reopen_secs'], 3)} s "
        f"({full['reopen_index']})",
        met=met,
        readme=f"an empty one opens in {num(empty['first_open_secs'], 2)} s with "
        f"{mb(empty['rss_after_open_bytes'])} resident",
    )


def durability(s: Source) -> Figure:
    modes = ("wal", "no-wal", "sync-wal")
    return Figure(
        ", ".join(f"`{m}` {millions(s.result(m)['ids_per_sec'])}" for m in modes)
        + f" ids/s at {millions(s.result('wal')['keys'], 0)} ids"
    )


def route_order(line: dict):
    """The server libraries' route first, then the browsers'."""
    return (line["route"] != "/v1/batch", line["route"])


def ingest_summary(s: Source, connections: int):
    lines = [
        line
        for line in s.data
        if line.get("connections") == connections and "median_ratio" in line
    ]
    if not lines:
        raise Missing(f"no summary line for {connections} connections")
    return sorted(lines, key=route_order)


def front_door(connections: int, target: float, readme):
    def figure(s: Source) -> Figure:
        lines = ingest_summary(s, connections)
        cell = "; ".join(
            f"`{x['route']}` {num(x['median_ratio'])} ({whole(x['median_ingest_events_per_sec'])} "
            f"events/s, p99 {num(x['median_ingest_p99_ms'], 1)} ms)"
            for x in lines
        )
        return Figure(
            "median ratio " + cell,
            met=min(x["median_ratio"] for x in lines) >= target,
            readme=readme(lines),
        )

    return figure


def front_door_cpu(s: Source) -> Figure:
    def cpu(connections):
        return [
            x["ingest_cpu_us_per_event"]
            for x in s.data
            if x.get("connections") == connections and "ingest_cpu_us_per_event" in x
        ]

    at128, at32 = cpu(128), cpu(32)
    return Figure(
        f"{span(at128)} µs at 128 connections, {span(at32)} µs at 32",
        met=max(at128) <= 2.5,
    )


def floor(s: Source) -> Figure:
    """The front door built to read nothing (docs/bench/floor-without-parse.patch)."""
    at128, at32 = ingest_summary(s, 128), ingest_summary(s, 32)
    cpu128 = [
        x["ingest_cpu_us_per_event"]
        for x in s.data
        if x.get("connections") == 128 and "ingest_cpu_us_per_event" in x
    ]
    return Figure(
        f"median ratio {num(at128[0]['median_ratio'])} at 128 connections, {num(at32[0]['median_ratio'])} at 32; "
        f"{span(cpu128)} µs per event at 128"
    )


def end_to_end(s: Source) -> Figure:
    lines = sorted((x for x in s.data if "median_e2e_p50_ms" in x), key=route_order)
    if not lines:
        raise Missing("no end-to-end summary line")
    p50 = [x["median_e2e_p50_ms"] for x in lines]
    return Figure(
        "; ".join(
            f"`{x['route']}` p50 {whole(x['median_e2e_p50_ms'])} ms, p99 {whole(x['median_e2e_p99_ms'])} ms "
            f"({whole(x['median_e2e_events_per_sec'])} events/s)"
            for x in lines
        ),
        readme=f"readable in the output {span(p50, whole)} ms after its request at p50",
    )


def parse(s: Source) -> Figure:
    runs = field(s.data, "runs")
    builds = list(dict.fromkeys(r["build"] for r in runs))
    if len(builds) != 2:
        raise Missing("parse.json should hold runs of two builds, the one before first")

    def ns(build, prefix):
        hits = [
            line["ns_per_event"]
            for r in runs
            if r["build"] == build
            for line in r["lines"]
            if line["case"].startswith(prefix)
        ]
        if not hits:
            raise Missing(f"no case starting {prefix!r} for {build}")
        return span(hits, whole)

    before, now = builds
    return Figure(
        f"each event read strictly within the body's pass {ns(now, 'batch: one strict pass per event within')} ns "
        f"per event against {ns(now, 'batch: the body')} for the body's skim and then each event's strict "
        f"read, {ns(now, 'batch: two serde_json')} for the two serde_json passes; a request's records made "
        f"in {ns(now, 'batch: the whole making')} ns per event against {ns(before, 'batch: the whole making')} "
        f"on the build before"
    )


# Faults (docs/testing.md), from faults.json


def fault(s: Source, key: str) -> dict:
    return field(s.data, "faults", key)


def over(values, target) -> int:
    return sum(1 for v in values if v > target)


def kills(s: Source) -> Figure:
    f = fault(s, "kills")
    t = f["target_secs"]
    suite = [k for run in f["full_suite_per_kill_secs"] for k in run]
    alone = f["alone_longest_per_run_secs"]
    return Figure(
        f"alone: longest {num(max(alone), 1)} s, {f['alone_kills_over_target']} of {f['alone_kills']} "
        f"kills over {t} s ({len(alone)} runs); full suites: {span(suite)} s per kill, median "
        f"{num(statistics.median(suite), 1)} s, {over(suite, t)} of {len(suite)} over {t} s "
        f"({len(f['full_suite_per_kill_secs'])} runs); before: {num(f['before_secs'], 1)} s",
        met=f["alone_kills_over_target"] == 0 and over(suite, t) == 0,
        readme=f"{span(suite)} s of each node killed (median {num(statistics.median(suite), 1)} s, "
        f"{over(suite, t)} of {len(suite)} kills over {t} s)",
    )


def stalls(key: str, alone_key: str, suite_key: str, readme=None):
    def figure(s: Source) -> Figure:
        f = fault(s, key)
        t = f["target_secs"]
        alone, suite = f[alone_key], f[suite_key]
        cell = (
            f"alone: {span(alone)} s, median {num(statistics.median(alone), 1)} s ({len(alone)} runs, "
            f"{over(alone, t)} over {t} s); full suites: {span(suite)} s, median "
            f"{num(statistics.median(suite), 1)} s ({len(suite)} runs, {over(suite, t)} over {t} s); "
            f"before: {num(f['before_secs'], 1)} s"
        )
        return Figure(
            cell,
            met=over(alone, t) == 0 and over(suite, t) == 0,
            readme=readme(alone, suite) if readme else None,
        )

    return figure


def cut(s: Source) -> Figure:
    f = fault(s, "cut")
    t = f["target_secs"]
    others = f["alone_others_secs"] + f["full_suite_others_secs"]
    back = f["alone_back_after_link_secs"] + f["full_suite_back_after_link_secs"]
    return Figure(
        f"partitions that do not need the node: {span(f['alone_others_secs'])} s alone, "
        f"{span(f['full_suite_others_secs'])} s in full suites ({len(others)} runs, {over(others, t)} "
        f"over {t} s); those that do grew again {span(back)} s after the link was back; before: "
        f"{num(f['before_secs'], 1)} s",
        met=over(others, t) == 0 and over(back, t) == 0,
    )


def long_variant(key: str, what: Callable[[dict], str]):
    def figure(s: Source) -> Figure:
        f = fault(s, key)
        return Figure(
            f"{what(f)}: longest stall {num(f['longest_secs'], 1)} s",
            met=f["longest_secs"] <= f["target_secs"],
        )

    return figure


PIPELINE = "the-pipeline-dedupe-against-a-pass-through-copy"
HANDOFF = "moving-a-partition-between-workers"
CLUSTER = "cargo nextest run --release --locked --workspace --features dedupe-actors/failpoints --test cluster --no-capture -E"

ROWS = [
    Row("performance", "pipeline", "the worker against a pass-through copy with the same transactions, on a backlog, then at 20k msgs/s", PIPELINE,
        "pipeline.json", "≥ 0.95 of its throughput; p99 ≤ 1.5× its p99", pipeline),
    Row("performance", "handoff, 50M ids over 24 h", "an empty worker takes a partition over and loads its whole window", HANDOFF,
        "handoff-50m.json", "first publish ≤ 10 s; no old duplicate published",
        handoff(["1", "2", "3"], lambda r: f"{millions(r['ids'], 0)} ids over 24 hours loaded by an empty worker, which publishes again "
                f"within {num(r['handover_ready_secs'], 1)} s of its assignment in three runs in a row", 10), run="1"),
    Row("performance", "handoff, 200M ids over 24 h", "the same, 8-byte values", HANDOFF,
        "handoff-200m.json", "first publish ≤ 40 s; no old duplicate published",
        handoff("1", lambda r: f"({millions(r['ids'], 0)}: {num(r['handover_ready_secs'], 1)} s)", 40), run="1"),
    Row("performance", "handoff, the group's part", "1M ids moved three ways: the old owner SIGTERMed (dynamic members, the default), SIGTERMed as a static member, SIGKILLed; the local broker's 6 s session and 1 s heartbeat", HANDOFF,
        "handoff-moves.json", "SIGTERM to assignment ≤ 2 s; no old duplicate published", moves, run="sigterm"),
    Row("performance", "ledger, 10M ids", "random ids in 4096-id batches, 1% re-sent, against Segment's design and a HashSet in the same run", "the-ledger",
        "ledger.json", "≥ 1M ids/s; ≥ 5×; ≤ 20 bytes per id; peak RSS ≤ 2 GiB", ledger(True)),
    Row("performance", "ledger, 100M ids", "the same, the baselines on the first 10M ids", "the-ledger",
        "ledger-100m.json", "≥ 1M ids/s; ≥ 5×; ≤ 20 bytes per id; peak RSS ≤ 2 GiB",
        ledger(True, lambda r: f"{millions(r['ids_per_sec'])} ids/s at {millions(r['keys'], 0)} ids, "
               f"{num(r['ratio_vs_segment'], 1)}× Segment's design in the same run, at "
               f"{num(r['bytes_per_key'], 1)} bytes per id")),
    Row("performance", "ledger, aging", "20M ids into a 300 MB budget: the oldest generations dropped as ids arrive", "aging",
        "ledger-aging.json", "aged ≥ 90% of un-aged; disk within the budget, one generation and twice the id index", aging),
    Row("performance", "ledger, 1B ids", "a billion ids, no baselines", "at-a-billion-ids",
        "billion.json", "≥ 1M ids/s; ≤ 18 bytes per id; slowest batch ≤ 1 s; reopen ≤ 5 s; checkpoint ≥ 2× faster than a rebuild",
        billion, run="1b"),
    Row("performance", "ledger, 1B ids, aging", "a billion ids into an 8 GiB budget", "at-a-billion-ids",
        "billion.json", "aged ≥ 90% of un-aged; disk within its bound", billion_aging, run="1b-aging"),
    Row("performance", "content digests, 20M ids", "the same ids without and with a 2-byte digest each", "content-digests",
        "digests.json", "—", digests, run="with"),
    Row("performance", "refreshing ids, 5M ids", "the same ids with refresh off and on, at 1% and 10% re-sent, alternately, two rounds", "refreshing-ids",
        "refresh.json", "—", refresh, run="on-10%"),
    Row("performance", "opening a ledger", "the service's default budget: open empty, record, close, reopen", "opening-a-ledger",
        "open.json", "empty: open ≤ 1 s, ≤ 300 MB, close ≤ 1 s, ≤ 50 MB on disk; 10M: close ≤ 2 s, index file ≤ 200 MB, reopen ≤ 1 s",
        opening),
    Row("performance", "durability modes, 5M ids", "the ledger bench in each mode", "durability-modes",
        "durability.json", "—", durability,
        command="dedupe bench ledger --keys 5000000 --no-baselines --durability MODE --dir /var/tmp --json"),
    Row("performance", "rekey, 1M records", "dedupe rekey against the same stage copying each record with its key, alternately, median of three", "re-keying-a-topic",
        "rekey.json", "—", rekey),
    Row("performance", "tracking API, 128 connections", "wrk's 20-event batches against Kafka's own producer, median of three rounds", "the-tracking-api",
        "ingest.jsonl", "≥ 0.8",
        front_door(128, 0.8, lambda lines: f"{kspan([x['median_ingest_events_per_sec'] for x in lines])} events/s "
                   f"at 128 connections ({span([x['median_ratio'] for x in lines], num)} of Kafka's own producer's rate)"),
        command="deploy/bench/ingest.sh"),
    Row("performance", "tracking API, 32 connections", "the same at 32 connections", "the-tracking-api",
        "ingest.jsonl", "≥ 0.65",
        front_door(32, 0.65, lambda lines: f"{kspan([x['median_ingest_events_per_sec'] for x in lines])} at 32"),
        command="deploy/bench/ingest.sh"),
    Row("performance", "tracking API, CPU per event", "the front door's user and system time over each wrk run, per event accepted", "the-tracking-api",
        "ingest.jsonl", "≤ 2.5 µs", front_door_cpu, command="deploy/bench/ingest.sh"),
    Row("performance", "tracking API, without the parse", "the same bench against a build that reads nothing: each body cut into records of its bytes (the floor)", "the-tracking-api",
        "ingest-floor.jsonl", "—", floor,
        command="DEDUPE_BIN=FLOOR_BUILD BENCH_ROUTES=/v1/batch deploy/bench/ingest.sh"),
    Row("performance", "tracking API, end to end", "the worker behind the front door; each record's wait until readable `read_committed`", "the-tracking-api",
        "ingest.jsonl", "—", end_to_end, command="deploy/bench/ingest.sh"),
    Row("performance", "tracking API, the parse", "the bench's events through the reader, the serde_json passes it replaced and sonic-rs", "the-tracking-api",
        "parse.json", "—", parse),

    Row("testing", "kills", "each node killed and restarted in turn, the partition's leaders and coordinators among them", "kills",
        "faults.json", "≤ 15 s per kill", kills, command=f"{CLUSTER} 'test(leaders_and)'"),
    Row("testing", "pause, 65 s", "a transaction coordinator (the active controller when it coordinates one) paused with SIGSTOP", "a-paused-node",
        "faults.json", "≤ 25 s",
        stalls("pause", "alone_secs", "full_suite_secs",
               lambda alone, suite: f"within a median {num(statistics.median(alone), 1)} s alone and "
               f"{num(statistics.median(suite), 1)} s in full suites of a node paused for 65 s, "
               f"{num(max(alone), 1)} s at most alone and {num(max(suite), 1)} s in the worst of {len(suite)} full suites"),
        command=f"{CLUSTER} 'test(paused)'"),
    Row("testing", "cut, 60 s", "an output leader cut off from the worker by a blackhole route", "a-node-cut-off",
        "faults.json", "≤ 25 s", cut, command=f"{CLUSTER} 'test(cut_off)'"),
    Row("testing", "the whole cluster down, 60 s", "all three nodes SIGKILLed and restarted after a minute", "the-whole-cluster-down",
        "faults.json", "≤ 15 s after the last node is back",
        stalls("outage", "alone_back_after_secs", "full_suite_back_after_secs",
               lambda alone, suite: f"flowing again {span(alone + suite)} s after the cluster is back"),
        command=f"{CLUSTER} 'test(whole_cluster)'"),
    Row("testing", "rolling restart", "each node stopped with SIGTERM and started again, in turn", "a-rolling-restart",
        "faults.json", "≤ 25 s", stalls("rolling", "alone_secs", "full_suite_secs"),
        command=f"{CLUSTER} 'test(rolling)'"),
    Row("testing", "kills, long variant", "30 kills, each 2 to 7 s after the previous node's restart", "the-long-variant",
        "faults.json", "≤ 25 s", long_variant("long_kills", lambda f: f"{f['kills']} kills"),
        command=f"DEDUPE_CLUSTER_LONG=1 {CLUSTER} 'test(leaders_and)'"),
    Row("testing", "pause, 130 s", "the pause, held 130 s", "the-long-variant",
        "faults.json", "≤ 25 s", long_variant("long_pause", lambda f: f"paused {f['pause_secs']} s"),
        command=f"DEDUPE_CLUSTER_LONG=1 {CLUSTER} 'test(paused)'"),
]


# ---------------------------------------------------------------------------------------------
# The figures in the prose of README.md, docs/operations.md and docs/architecture.md
#
# Each measured figure those pages state is a Claim: a phrase rendered from docs/bench/ that the
# page must contain word for word (line breaks count as spaces, link targets are left out). Every
# number with a measurement's unit in their prose (outside fenced code and inline code) must stand
# inside a claim's phrase, a README headline phrase, or a phrase of NOT_MEASURED: a setting, a
# default, a design constant or arithmetic on them, each listed with the reason it is not a
# measurement. So a figure typed into one of those pages alone, or left behind by a new run, fails.

PROSE_DOCS = ("README.md", "docs/operations.md", "docs/architecture.md")

# A number, or a range of two, with a unit that measurements carry.
MEASURED = re.compile(
    r"(?<![A-Za-z_\d.])~?\d[\d,]*(?:\.\d+)?(?:(?:-| to )\d[\d,]*(?:\.\d+)?)?\s?[kMG]?\s?"
    r"(?:bytes per id|bytes each|bytes|ids/s|msgs/s|events/s|records/s|s per million ids"
    r"|minutes?|min|hours?|h|s|ms|µs|MB|GB|MiB|GiB|×)(?![A-Za-z\d])"
)


def minutes_seconds(secs) -> str:
    secs = int(Decimal(repr(float(secs))).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    return f"{secs // 60} min {secs % 60} s"


def ledger_bytes() -> tuple:
    """Bytes per id at 100M ids, and with content digests (the digests bench's difference added,
    as `dedupe plan` does)."""
    plain = source("ledger-100m.json").result()["bytes_per_key"]
    with_, without = source("digests.json").result("with"), source("digests.json").result("without")
    return plain, plain + with_["bytes_per_key"] - without["bytes_per_key"]


def handover_runs() -> list:
    """(ids, first publish secs) of every handoff run of the table: 50M three times, 200M once."""
    runs = [source("handoff-50m.json").result(n) for n in ("1", "2", "3")]
    runs.append(source("handoff-200m.json").result("1"))
    return [(r["ids"], r["handover_ready_secs"]) for r in runs]


def per_million() -> str:
    return span([secs / ids * 1e6 for ids, secs in handover_runs()], lambda v: num(v, 2))


def changelog_bytes_per_id() -> float:
    r = source("handoff-50m.json").result("1")
    return r["changelog_bytes"] / r["ids"]


def budget_hours(rate: float, generations: int = 8) -> tuple:
    """What the default 16 GiB budget holds at `rate` ids/s with digests: hours, and hours just
    after a generation was dropped."""
    ids = 16 * 2**30 / ledger_bytes()[1]
    full = ids / rate / 3600
    return ids, whole(full), whole(full * (generations - 1) / generations)


def pause_medians() -> tuple:
    f = fault(source("faults.json"), "pause")
    return f["alone_secs"], f["full_suite_secs"]


def build(key: str) -> float:
    return source("build.json").result()[key]


@dataclass
class Claim:
    doc: str
    what: str
    phrase: Callable[[], str]


def _empty_ledger() -> dict:
    sizes = source("open.json").result()
    sizes = sizes["sizes"] if isinstance(sizes, dict) else sizes
    return next(r for r in sizes if r["ids"] == 0)


def _billion() -> dict:
    return source("billion.json").result("1b")


def _hours_claim() -> str:
    ids, h5, dip5 = budget_hours(5000)
    _, h10, dip10 = budget_hours(10000)
    return (f"holds about {int(round(ids / 1e7)) * 10}M ids at that size: {h5} hours at 5,000 ids/s per "
            f"worker, dipping to {dip5} when a generation is dropped; at 10,000 ids/s, {h10} hours "
            f"dipping to {dip10}")


def _no_wal_claim() -> str:
    rate = source("pipeline.json").result()["dedupe_msgs_per_sec"]
    # Two commits' worth of ids at the default 64 MiB write buffer, 24 bytes an entry.
    return f"about {whole(2 * 64 * 2**20 / 24 / rate)} s at {thousands(rate)} msgs/s"


CLAIMS = [
    Claim("README.md", "the demo on a fresh machine (build.json)",
          lambda: f"{minutes_seconds(build('demo_secs'))} on a fresh 2-core machine, "
          f"{minutes_seconds(build('build_secs'))} of it the build"),
    Claim("README.md", "a clean build inside the demo (build.json)",
          lambda: f"about {whole(build('build_secs') / 60)} minutes on a fresh 2-core machine "
          f"({minutes_seconds(build('build_secs'))} inside the demo"),
    Claim("README.md", "a move's load per million ids (handoff-50m.json, handoff-200m.json)",
          lambda: f"{per_million()} s per million ids"),
    Claim("README.md", "the default budget's hours at 5,000 ids/s (ledger-100m.json, digests.json)",
          lambda: f"~{budget_hours(5000)[1]} h of ids at 5,000 ids/s per worker"),
    Claim("README.md", "bytes per id with digests (ledger-100m.json, digests.json)",
          lambda: f"about {whole(ledger_bytes()[1])} bytes"),
    Claim("docs/operations.md", "what digests add (ledger-100m.json, digests.json)",
          lambda: f"cost about {whole(ledger_bytes()[1] - ledger_bytes()[0])} bytes per id on top of "
          f"the ledger's {num(ledger_bytes()[0], 1)}"),
    Claim("docs/operations.md", "what the default budget holds (ledger-100m.json, digests.json)",
          _hours_claim),
    Claim("docs/operations.md", "a ten-minute run's bytes per id (plan-run.json)",
          lambda: f"held its ids at {num(source('plan-run.json').result()['bytes_per_id'], 1)} bytes each"),
    Claim("docs/operations.md", "an empty ledger's open (open.json)",
          lambda: f"opens in {num(_empty_ledger()['first_open_secs'])} s with "
          f"{mb(_empty_ledger()['rss_after_open_bytes'])} resident"),
    Claim("docs/operations.md", "a billion ids' reopen (billion.json)",
          lambda: f"({num(_billion()['reopen_secs'])} s for a billion ids)"),
    Claim("docs/operations.md", "a billion ids' rebuild (billion.json)",
          lambda: f"{whole(_billion()['rebuild_secs'])} s for a billion ids"),
    Claim("docs/operations.md", "a move's pause (handoff-50m.json, handoff-200m.json)",
          lambda: f"about {per_million()} s per million ids on the project's machine, so a partition "
          f"with 50M ids pauses about {whole(max(s for i, s in handover_runs() if i == 50e6))} s and one "
          f"with 200M about {whole(max(s for i, s in handover_runs() if i == 200e6))} s"),
    Claim("docs/operations.md", "a SIGTERMed owner's move (handoff-moves.json)",
          lambda: f"Measured on the local broker: {move_secs('sigterm')} s from SIGTERM to the new owner's assignment"),
    Claim("docs/operations.md", "a static member's move (handoff-moves.json)",
          lambda: f"session timeout ({move_secs('static')} s here)"),
    Claim("docs/operations.md", "a SIGKILLed owner's move (handoff-moves.json)",
          lambda: f"Measured on the local broker: {move_secs('sigkill')} s from SIGKILL to the new owner's assignment"),
    Claim("docs/operations.md", "the pause under Kafka's default request timeout (faults.json)",
          lambda: f"a paused node cost {whole(max(pause_medians()[1]))} s once in the test suite with 30 s"),
    Claim("docs/architecture.md", "the changelog's bytes per id, in the picture (handoff-50m.json)",
          lambda: f"~{whole(changelog_bytes_per_id())} bytes per published id"),
    Claim("docs/architecture.md", "the changelog's bytes per id (handoff-50m.json)",
          lambda: f"about {whole(changelog_bytes_per_id())} bytes each"),
    Claim("docs/architecture.md", "the ledger's bytes per id (ledger-100m.json)",
          lambda: f"about {whole(ledger_bytes()[0] - 16)} bytes per id: about "
          f"{whole(ledger_bytes()[0])} bytes per id in all"),
    Claim("docs/architecture.md", "what a crash costs without a WAL (pipeline.json)", _no_wal_claim),
]

# Figures with a measurement's unit that are not measurements, per page: the phrase, and why.
NOT_MEASURED = {
    "README.md": [
        ("24 hours by default", "the promise's default"),
        ("clients give up on a silent broker after 10 s", "the clients' socket timeout"),
        ("about 9 s of them the cluster's failover", "the brokers' broker.session.timeout.ms"),
        ("about 25 GiB for the default 16 GiB budget", "the budget's arithmetic"),
        ("24 hours", "the promise's default"),
    ],
    "docs/operations.md": [
        ("(default 86400: **24 hours**", "the promise's default"),
        ("for at most 15 s)", "explain's search of the dead-letter topic, a constant"),
        ("5 s by Kafka's default, 1 s on the local broker", "the heartbeat settings: Kafka's and deploy/local/kafka.sh's"),
        ("45 s by Kafka's default, 6 s on the local broker", "the session settings: Kafka's and deploy/local/kafka.sh's"),
        ("45 s and 5 s by default", "the brokers' lower bounds, Kafka's defaults"),
        ("stays under it for 10 minutes", "the page's `for:`"),
        ("For 5,000 ids/s and the default promise", "the sizing example's rate"),
        ("the default configuration at 5,000 ids/s", "the ten-minute run's rate: the sizing example's"),
        ("The default budget, 16 GiB,", "the budget's default"),
        ("a page under the 24-hour", "the promise's default"),
        ("starts at 54 MiB and doubles", "the id index's first size, a constant"),
        ("at about 3.4 bytes each", "the id index's entry: a 16-bit fingerprint and its share of a bucket"),
        ("(3.4 GiB for 16 GiB;", "the id index's arithmetic at the default budget"),
        ("request 5 GiB for the default budget", "the manifests' request"),
        ("hung 30 s past its own timeout", "the watchdog's setting"),
        ("waited 10 ms for room", "the worker's wait, a constant"),
        ("at most one line per 10 s", "the log limiter's interval"),
        ("for 10 min", "alert rules' `for:`"),
        ("for 30 min", "alert rules' `for:`"),
        ("for 15 min", "alert rules' `for:`"),
        ("for 5 min", "alert rules' `for:`"),
        ("under 1.5 × its", "the forecast rule's factor"),
        ("more than 3 h old", "the snapshot rule's threshold"),
        ("silent at 9 minutes of a low window", "the promtool test's evaluation time"),
        ("ask for 32 GiB for a 16 GiB budget", "the manifests' volume at the default budget"),
        ("(36 h for the default 24 h)", "the forecast rule's arithmetic"),
        ("none succeeded for 3 hours", "the snapshot rule's threshold"),
        ("within 5 minutes", "the retake policy's fence memory"),
        ("more than 10 minutes ago", "the handover rule's threshold"),
        ("A record over 1,000,000 bytes", "the producer's message.max.bytes, librdkafka's default"),
        ("about 1.2 × 10¹² ids/s", "the plan's arithmetic at Kafka's largest partition count"),
        ("(64 MiB, and room", "the configuration's least budget, a constant"),
        ("512 MiB with the defaults", "the configuration's least budget at the default write buffer and generations"),
        ("about 2 bytes per id more than the seconds", "the varint's arithmetic: milliseconds take 10 bits more than seconds"),
        ("within 30 s and the partition", "the stall's longest backoff, a constant"),
        ("after 1 s, doubling up to 30 s", "the stall's backoff, constants"),
        ("(again every 5 minutes)", "the stall's log interval, a constant"),
        ("pages after 5 minutes", "the alert rule's `for:`"),
        ("1,000,000-byte `message.max.bytes`", "librdkafka's default"),
        ("16 bytes of the SHA-256", "the fingerprint's length"),
        ("20 ms after", "the batch linger's default"),
        ("keeps 2 bytes of the digest", "the digest's length"),
        ("about 45 bytes each", "a forget mark's record: the key and two timestamps"),
        ("first 8 bytes of its ledger key", "the audit sample's key prefix"),
        ("(1 s, 10 s, 1 min, 5 min, 15 min, 1 h, 3 h, 6 h, 12 h, 24 h,", "the histogram's buckets"),
        ("`dedupe_ledger_index_bytes`: 3.4 GiB", "the id index's arithmetic at the default budget"),
        ("(45 s by default;", "Kafka's group.consumer.session.timeout.ms"),
        ("sets 6 s)", "the local broker's setting"),
        ("(2, 4, 8 s…)", "the join backoff"),
        ("the promised window, 24 hours)", "the promise's default"),
        ("leaderships after about 9 s", "the brokers' broker.session.timeout.ms"),
        ("give up on a silent node after 10 s", "the clients' socket timeout"),
        ("look the leaders up every 3 s", "the clients' metadata refresh"),
        ("10 s recommended** (Kafka's default is 30 s)", "the brokers' request.timeout.ms"),
        ("`deploy/local/cluster.sh`) sets 10 s", "the test cluster's setting"),
        ("naming the brokers after 15 s", "the start's broker timeout"),
        ("unreachable brokers (15 s)", "the start's broker timeout"),
    ],
    "docs/architecture.md": [
        ("The ledger key is 16 bytes", "the key's length"),
        ("a flush may take 5 s more", "the flush's grace, a constant"),
        ("within 5 minutes", "the retake policy's fence memory"),
        ("(less 5 minutes for clock skew)", "the window floor's allowance"),
        ("a backoff of 0.1 to 4 s", "the retake backoff"),
        ("Every client waits 10 s for a broker's answer", "the clients' socket timeout"),
        ("and 3 s for a new connection", "the clients' connection setup timeout"),
        ("librdkafka's defaults are 60 s and 30 s", "librdkafka's defaults"),
        ("looks the leaders up every 3 s", "the clients' metadata refresh"),
        ("librdkafka's default is 10 s", "librdkafka's default"),
        ("(between 10 and 15 s)", "the call budget's bounds"),
        ("at about 3.4 bytes each", "the id index's entry: a 16-bit fingerprint and its share of a bucket"),
        ("8 MiB piece", "the index file's piece size"),
        ("the default 64 MiB", "the write buffer's default"),
        ("16 + 2 + 6.8 ≈ 25 GiB for the default 16 GiB budget", "the budget's arithmetic"),
        ("the manifests' volume is 32 GiB", "the manifests' volume"),
    ],
}


def flatten(text: str, fenced: bool) -> str:
    """The page as one line: link targets left out, fenced code kept or left out."""
    lines = text.splitlines() if fenced else [line for _, line in prose(text)]
    return re.sub(r"\]\([^)]*\)", "]", " ".join(" ".join(lines).split()))


def occurrences(text: str, phrase: str):
    start = text.find(phrase)
    while start >= 0:
        yield start, start + len(phrase)
        start = text.find(phrase, start + 1)


def check_prose(headline: list, problems: list):
    for doc in PROSE_DOCS:
        text = (ROOT / doc).read_text()
        whole_page, page = flatten(text, True), flatten(text, False)
        allowed = []
        for claim in (c for c in CLAIMS if c.doc == doc):
            try:
                phrase = claim.phrase()
            except KeyError as e:
                problems.append(f"{doc}, {claim.what}: no field {e} in its JSON")
                continue
            except (Missing, StopIteration, ValueError, TypeError) as e:
                problems.append(f"{doc}, {claim.what}: {e}")
                continue
            if phrase not in whole_page:
                problems.append(f"{doc} does not say what docs/bench/ renders for {claim.what}: {phrase!r}")
            allowed.append(phrase)
        if doc == "README.md":
            allowed += [phrase for _, phrase in headline]
        for phrase, _why in NOT_MEASURED[doc]:
            if phrase not in page:
                problems.append(f"{doc} no longer says {phrase!r}: take it out of NOT_MEASURED")
            allowed.append(phrase)
        covered = [span for phrase in allowed for span in occurrences(page, phrase)]
        covered += [m.span() for m in re.finditer(r"`[^`]*`", page)]
        for m in MEASURED.finditer(page):
            if not any(a <= m.start() and m.end() <= b for a, b in covered):
                context = page[max(0, m.start() - 60): m.end() + 20]
                problems.append(
                    f"{doc} states {m.group(0)!r} (…{context}…) neither rendered from docs/bench/ (a CLAIMS "
                    "entry) nor listed in NOT_MEASURED as a setting"
                )


# ---------------------------------------------------------------------------------------------
# Rendering and checking


def cell(text: str) -> str:
    if "|" in text:
        raise ValueError(f"a table cell may not hold a pipe: {text}")
    return text


def render(doc: str, problems: list) -> tuple[str, list]:
    """The table for `doc`, and the README phrases of its rows."""
    lines = [
        "| bench or fault | method | command | current figure | target | raw JSON |",
        "|---|---|---|---|---|---|",
    ]
    if doc == "testing":
        lines[0] = lines[0].replace("bench or fault", "fault")
    phrases = []
    for row in (r for r in ROWS if r.doc == doc):
        try:
            s = source(row.file)
            figure = row.figure(s)
            command = row.command or (None if s.name.endswith(".jsonl") else s.command(row.run))
            if command is None:
                raise Missing(f"docs/bench/{row.file} names no command and the row gives none")
        except (Missing, KeyError, StopIteration, ValueError) as e:
            problems.append(f"{row.doc}.md, row {row.name!r}: {e}")
            continue
        target = row.target
        if figure.met is not None and row.target != "—":
            target += ": met" if figure.met else ": **not met**"
        raw = f"[{row.file}](bench/{row.file})" + (" (transcribed)" if s.transcribed else "")
        lines.append(
            "| "
            + " | ".join(
                cell(x)
                for x in (row.name, f"[{row.method}](#{row.section})", f"`{command}`", figure.cell, target, raw)
            )
            + " |"
        )
        if figure.readme:
            phrases.append((row, figure.readme))
    return "\n".join(lines), phrases


def replace_table(text: str, table: str, doc: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise Missing(f"docs/{doc}.md needs one {BEGIN} and one {END} after it")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def prose(text: str):
    """Lines outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            yield number, line


def dated_lines(text: str) -> list:
    return [(n, line) for n, line in prose(text) if DATE.search(line)]


def headline_section(readme: str) -> str:
    match = re.search(r"^## Headline figures\n(.*?)(?=^## )", readme, re.S | re.M)
    if not match:
        raise Missing("README.md has no '## Headline figures' section")
    return match.group(1)


def check_readme(phrases: list, problems: list):
    section = headline_section((ROOT / "README.md").read_text())
    flat = re.sub(r"\]\([^)]*\)", "]", " ".join(section.split()))
    for row, phrase in phrases:
        if phrase not in flat:
            problems.append(
                f"README.md's Headline figures do not say what the {row.doc}.md row {row.name!r} "
                f"renders: {phrase!r}"
            )
    rest = flat
    for _, phrase in phrases:
        rest = rest.replace(phrase, " ")
    for stray in NUMBER.findall(rest):
        problems.append(
            f"README.md's Headline figures state {stray!r} outside every rendered phrase: "
            "take it from a row (a ROWS entry's readme) or leave it out"
        )


def main(argv: list) -> int:
    check = argv[1:] == ["--check"]
    if argv[1:] and not check:
        print(__doc__, file=sys.stderr)
        return 2
    problems: list = []
    phrases = []
    for doc in ("performance", "testing"):
        path = ROOT / "docs" / f"{doc}.md"
        text = path.read_text()
        table, found = render(doc, problems)
        phrases += found
        try:
            wanted = replace_table(text, table, doc)
        except Missing as e:
            problems.append(str(e))
            continue
        if wanted != text:
            if check:
                old = text.split(BEGIN)[1].split(END)[0].strip().splitlines()
                new = table.splitlines()
                differ = [f"  doc:  {a}\n  JSON: {b}" for a, b in zip(old, new) if a != b]
                if len(old) != len(new):
                    differ.append(f"  {len(old)} lines in the doc's table, {len(new)} rendered")
                problems.append(
                    f"docs/{doc}.md's figures table differs from docs/bench/ (run deploy/bench/figures.py):\n"
                    + "\n".join(differ)
                )
            else:
                path.write_text(wanted)
                print(f"figures: rewrote the table of docs/{doc}.md")
        dated = dated_lines(wanted)
        if len(dated) > MAX_DATED_LINES:
            problems.append(
                f"docs/{doc}.md has {len(dated)} dated lines (at most {MAX_DATED_LINES}; dated runs go to "
                "CHANGELOG.md):\n" + "\n".join(f"  {n}: {line.strip()[:100]}" for n, line in dated)
            )
    try:
        check_readme(phrases, problems)
    except Missing as e:
        problems.append(str(e))
    check_prose(phrases, problems)
    for problem in problems:
        print(f"figures: {problem}", file=sys.stderr)
    if not problems:
        print("figures: the tables match docs/bench/, the README agrees, dated lines within bounds")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
