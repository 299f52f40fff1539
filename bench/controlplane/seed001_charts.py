"""Charts of bench/controlplane/seed001, one per scale test, from results.json and samples.jsonl:
time to ready per step on top; the process's CPU (cores) and RSS over the test below, with
each step's start marked. Runs under a Python with matplotlib (bench/common.py chart_python).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = sys.argv[1]
with open(os.path.join(OUT, "results.json")) as f:
    RESULTS = json.load(f)["results"]
SAMPLES = []
with open(os.path.join(OUT, "samples.jsonl")) as f:
    for line in f:
        SAMPLES.append(json.loads(line))

for test in ("listeners", "https", "routes", "upstreams"):
    if test not in RESULTS:
        continue
    r = RESULTS[test]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7))
    xs = [row.get("endpoints", row["step"] + 1) for row in r["rows"]]
    top.plot(xs, [row["ttr_ms"] for row in r["rows"]], marker=".", linewidth=1)
    top.set_xlabel("upstream servers" if test == "upstreams" else f"{test} (step)")
    top.set_ylabel("time to ready (ms)")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.set_title(f"seed 001, {test}: time to ready per step")
    pts = [s for s in SAMPLES if r["t0"] <= s["t"] <= r["t1"]]
    ts = [s["t"] - r["t0"] for s in pts]
    bottom.plot(ts, [s["cores"] for s in pts], color="tab:blue", linewidth=1, label="CPU (cores)")
    bottom.set_ylabel("CPU (cores)")
    bottom.set_xlabel("seconds into the test")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    rss = bottom.twinx()
    rss.plot(ts, [s["rss_mb"] for s in pts], color="tab:orange", linewidth=1, label="RSS (MiB)")
    rss.set_ylabel("RSS (MiB)")
    rss.set_ylim(bottom=0)
    lines = bottom.get_lines() + rss.get_lines()
    bottom.legend(lines, [line.get_label() for line in lines], loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, f"{test}.png"), dpi=90)
    plt.close(fig)
