#!/usr/bin/env python3
"""Draws docs/performance.md's plots from the benches' JSON.

    deploy/bench/plot.py [DIR]

DIR (default docs/bench) holds the last JSON line of each bench's latest run, saved by hand:
`handoff.json` (`dedupe bench handoff --json`) draws the window during a handover. Each plot whose
JSON is present is written to docs/images/ as SVG; a missing file is named and skipped, a JSON
without the fields a plot needs is an error. Needs matplotlib (Debian: python3-matplotlib).
"""

import json
import pathlib
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
# Deterministic SVG text, so a redraw of the same JSON changes no committed byte.
plt.rcParams["svg.hashsalt"] = "dedupe"
plt.rcParams["svg.fonttype"] = "none"


def handoff(bench, out):
    """The window during a handover: B's window against A's, aged, from B's assignment."""
    samples = bench["window_samples"]
    t = [s["at_secs"] for s in samples]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(t, [s["target_secs"] / 3600 for s in samples], "--", color="grey", label="A's window, aged since")
    ax.plot(t, [s["window_secs"] / 3600 for s in samples], color="tab:blue", label="B's window")
    ax.axvline(bench["handover_ready_secs"], color="tab:green", lw=0.8)
    ax.annotate(f"first publish, {bench['handover_ready_secs']:.1f} s ", (bench["handover_ready_secs"], 0), color="tab:green",
                va="bottom", ha="right", fontsize=8)
    ax.set_xlabel("seconds since B's assignment")
    ax.set_ylabel("window (hours)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Moving a partition of {bench['ids']:,} ids between workers")
    ax.legend(loc="center left", fontsize=8)
    save(fig, out)


def save(fig, name):
    fig.tight_layout()
    IMAGES.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGES / name, metadata={"Date": None})
    plt.close(fig)
    print(f"plot: wrote docs/images/{name}")


PLOTS = (("handoff.json", handoff, "handoff-window.svg"),)


def main():
    source = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "bench"
    for name, draw, out in PLOTS:
        path = source / name
        if not path.exists():
            print(f"plot: no {path}, so no {out}")
            continue
        try:
            draw(json.loads(path.read_text()), out)
        except (KeyError, json.JSONDecodeError) as e:
            sys.exit(f"plot: {path} lacks what {out} needs: {e!r}")


if __name__ == "__main__":
    main()
