#!/usr/bin/python3
"""Plots `swiftlet cachesim TRACE --csv` output: hit rate against cache size, one line per policy.

    build/bin/swiftlet cachesim trace.bin --csv > hits.csv
    tools/plot_cachesim.py hits.csv docs/cache-hit-rate.png [--title "35B-shaped, test split"]

Runs on Debian's /usr/bin/python3 with python3-matplotlib (scripts/install-deps.sh installs it).
"""
import argparse
import csv
import sys

LABELS = {
    "lfu": "engine (LFU + recency, layer shares)",
    "lfu-global": "LFU + recency over all layers",
    "lru": "LRU",
    "layer": "per-layer pools (engine policy)",
    "belady": "Belady (offline optimum)",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="output of swiftlet cachesim --csv")
    ap.add_argument("png", help="image to write")
    ap.add_argument("--title", default="Expert cache hit rate")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_cachesim.py: matplotlib is missing: apt-get install python3-matplotlib")

    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "size_pct" not in rows[0]:
        sys.exit(f"plot_cachesim.py: {args.csv} is not the CSV of swiftlet cachesim --csv")
    policies = [k for k in rows[0] if k not in ("size_pct", "slots")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in policies:
        pts = [(float(r["size_pct"]), 100 * float(r[p])) for r in rows if r[p] != ""]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=LABELS.get(p, p))
    ax.set_xlabel("cache size (% of all experts)")
    ax.set_ylabel("hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(args.title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
