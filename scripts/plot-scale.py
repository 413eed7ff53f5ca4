#!/usr/bin/env python3
"""Plots the scale simulation's `--csv` series (planner/examples/scale.rs):
broker load max/mean over simulated time, one panel per cluster size, the
events shaded. docs/SCALE.md shows the result.

    cargo run --release -p tessera-planner --example scale -- --csv loads.csv
    .venv/bin/python scripts/plot-scale.py loads.csv docs/scale-loads.png

Needs matplotlib (bench/requirements.txt installs it into the venv).
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The simulation's events, in order (the `event` column).
EVENTS = ["creation storm", "hot topic x10, split", "join + an hour of rolls",
          "controller passes", "rack lost", "brokers removed"]
SERIES = [("bytes_max_over_mean", "bytes in as primary"),
          ("primaries_max_over_mean", "primaries"),
          ("replicas_max_over_mean", "replicas of active segments")]


def main(src: str, dst: str) -> None:
    rows = defaultdict(list)
    with open(src) as f:
        for r in csv.DictReader(f):
            rows[int(r["brokers"])].append(r)
    sizes = sorted(rows)
    fig, axes = plt.subplots(len(sizes), 1, figsize=(10, 3.2 * len(sizes)), squeeze=False)
    shades = ["#f2f2f2", "#ffffff"]
    for ax, size in zip(axes[:, 0], sizes):
        data = rows[size]
        steps = [int(r["step"]) for r in data]
        # One shaded band per event, labelled at its start.
        bands = []
        for r, step in zip(data, steps):
            e = int(r["event"])
            if not bands or bands[-1][0] != e:
                bands.append([e, step, step])
            bands[-1][2] = step
        for i, (e, lo, hi) in enumerate(bands):
            ax.axvspan(lo, hi, color=shades[i % 2], zorder=0)
            ax.text(lo, 0.97 - 0.08 * (i % 3), " " + (EVENTS[e] if e < len(EVENTS) else str(e)),
                    transform=ax.get_xaxis_transform(), fontsize=7, va="top")
        for key, label in SERIES:
            if key in data[0]:
                ax.plot(steps, [float(r[key]) for r in data], label=label, linewidth=1.2)
        ax.axhline(1.0, color="#888888", linewidth=0.6, linestyle=":")
        ax.set_title(f"{size} brokers", fontsize=10)
        ax.set_ylabel("max / mean per broker")
        # The first samples of a creation storm (a few topics) reach 20x:
        # cut at 4 so the rest stays readable.
        ax.set_ylim(0.9, 4.0)
    axes[-1, 0].set_xlabel("metadata entries written (simulated time)")
    axes[0, 0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
