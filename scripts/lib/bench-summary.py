#!/usr/bin/env python3
"""Min / median / max of `fjord bench` results, per workload and broker.

usage: scripts/lib/bench-summary.py DIR [BROKER...]

Reads every DIR/*.json that `fjord bench --output DIR` wrote and prints a
Markdown table per workload: one row per broker label (in the order given,
then any others alphabetically), each cell `min / median / max` over that
broker's runs, with the number of runs. scripts/compare.sh writes it to
DIR/summary.md.
"""

import glob
import json
import os
import statistics
import sys

# (column title, getter, format) over one result.
COLUMNS = [
    ("runs", None, None),
    ("acked msg/s", lambda r: r["totals"]["publishRateAvg"], "{:,.0f}"),
    ("MB/s", lambda r: r["totals"]["publishMBps"], "{:.2f}"),
    ("publish p50 ms", lambda r: r["aggregatedPublishLatency50pct"], "{:.2f}"),
    ("publish p99 ms", lambda r: r["aggregatedPublishLatency99pct"], "{:.2f}"),
    ("publish p99.9 ms", lambda r: r["aggregatedPublishLatency999pct"], "{:.2f}"),
    ("publish delay p99 µs", lambda r: r["aggregatedPublishDelayLatency99pct"], "{:,.0f}"),
    ("e2e p99 ms", lambda r: r["aggregatedEndToEndLatency99pct"], "{:.2f}"),
    ("broker CPU s/GB", lambda r: r["broker"]["cpuSecondsPerGB"], "{:.3f}"),
    ("broker peak RSS MiB", lambda r: r["broker"]["peakRssBytes"] / 2**20, "{:.0f}"),
]


def value(getter, result):
    try:
        v = getter(result)
    except (KeyError, TypeError):
        return None
    return v if isinstance(v, (int, float)) else None


def cell(values, fmt):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "–"
    lo, mid, hi = values[0], statistics.median(values), values[-1]
    return " / ".join(fmt.format(v) for v in (lo, mid, hi))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip())
    directory, order = sys.argv[1], sys.argv[2:]
    results = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(r, dict) or "workload" not in r or "totals" not in r:
            continue
        label = r.get("driver") or r.get("config", {}).get("label", "?")
        results.setdefault(r["workload"], {}).setdefault(label, []).append(r)
    if not results:
        sys.exit(f"bench-summary: no fjord bench results in {directory}")
    print("Cells are min / median / max over the runs.\n")
    for workload in sorted(results):
        by_label = results[workload]
        labels = [l for l in order if l in by_label]
        labels += sorted(l for l in by_label if l not in labels)
        print(f"### {workload}\n")
        print("| broker | " + " | ".join(c[0] for c in COLUMNS) + " |")
        print("|---|" + "---|" * len(COLUMNS))
        for label in labels:
            runs = by_label[label]
            cells = [str(len(runs))]
            for _, getter, fmt in COLUMNS[1:]:
                cells.append(cell([value(getter, r) for r in runs], fmt))
            print(f"| {label} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
