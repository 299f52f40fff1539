"""PNG charts for a bench/dataplane/run result directory: `python charts.py DIR`.

Reads DIR/results.json, writes the PNGs into DIR and prints their file names (one a line).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"gatehouse": "#2b6cb0", "nginx": "#38a169"}
PROXIES = ["gatehouse", "nginx"]


def bars(ax, labels, series, ylabel, fmt="{:.0f}"):
    width = 0.38
    xs = range(len(labels))
    for i, name in enumerate(PROXIES):
        vals = [v if v is not None else 0 for v in series[name]]
        pos = [x + (i - 0.5) * width for x in xs]
        rects = ax.bar(pos, vals, width, label=name, color=COLORS[name])
        for r, v in zip(rects, series[name]):
            if v is not None:
                ax.annotate(fmt.format(v), (r.get_x() + r.get_width() / 2, r.get_height()),
                            ha="center", va="bottom", fontsize=7, rotation=90,
                            xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.2)


def main(out):
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    written = []
    subtitle = f"{res['date']}, commit {res['commit']}, " + (
        "quick mode" if res["quick"] else f"median of {res['reps']} x {res['duration']} s")

    routing = {k: v for k, v in res["phases"].items() if v["phase"] == "routing"}
    for key, ph in routing.items():
        ws = ph["workloads"]
        labels = list(ws)
        # Throughput per routing type.
        fig, ax = plt.subplots(figsize=(9, 4.5))
        series = {p: [ws[w]["summary"][p]["rps"] for w in labels] for p in PROXIES}
        bars(ax, labels, series, "requests/s (median)")
        ax.set_title(f"Throughput per routing type, 1 worker ({key})\n{subtitle}", fontsize=10)
        fig.tight_layout()
        name = f"throughput-{key}.png"
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        written.append(name)

        # Latency percentiles, one panel per workload.
        n = len(labels)
        cols = 4
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
        for i, w in enumerate(labels):
            ax = axes[i // cols][i % cols]
            for p in PROXIES:
                lat = ws[w]["summary"][p]["latency"]
                pts = sorted((int(k), v) for k, v in lat.items() if v is not None)
                if pts:
                    ax.plot([str(k) + "%" for k, _ in pts], [v for _, v in pts], marker="o",
                            label=p, color=COLORS[p])
            ax.set_title(w, fontsize=9)
            ax.set_ylabel("ms", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
        for j in range(n, rows * cols):
            axes[j // cols][j % cols].axis("off")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"Latency percentiles, 1 worker ({key}) — {subtitle}", fontsize=10)
        fig.tight_layout()
        name = f"latency-{key}.png"
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        written.append(name)

        # CPU per request.
        fig, ax = plt.subplots(figsize=(9, 4))
        series = {p: [ws[w]["summary"][p]["cpu_us_per_req"] for w in labels] for p in PROXIES}
        bars(ax, labels, series, "proxy CPU µs per request", fmt="{:.1f}")
        ax.set_title(f"Proxy CPU per request ({key})\n{subtitle}", fontsize=10)
        fig.tight_layout()
        name = f"cpu-{key}.png"
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        written.append(name)

    scale = {k: v for k, v in res["phases"].items() if v["phase"] == "scale"}
    if scale:
        wids = []
        for ph in scale.values():
            for w in ph["workloads"]:
                if w not in wids:
                    wids.append(w)
        fig, axes = plt.subplots(1, len(wids) + 1, figsize=(4.2 * (len(wids) + 1), 3.8),
                                 squeeze=False)
        for i, w in enumerate(wids):
            ax = axes[0][i]
            for p in PROXIES:
                pts = sorted((ph["workers"], ph["workloads"][w]["summary"][p]["rps"])
                             for ph in scale.values() if w in ph["workloads"])
                ax.plot([x for x, _ in pts], [y or 0 for _, y in pts], marker="o", label=p,
                        color=COLORS[p])
            ax.set_xticks([1, 2])
            ax.set_xlabel("proxy worker threads / processes")
            ax.set_ylabel("requests/s")
            ax.set_title(w, fontsize=9)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        ax = axes[0][-1]
        for p in PROXIES:
            pts = sorted((ph["workers"], ph["proxies"][p]["peak_rss_kib"] / 1024)
                         for ph in scale.values() if p in ph["proxies"])
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p, color=COLORS[p])
        ax.set_xticks([1, 2])
        ax.set_xlabel("proxy worker threads / processes")
        ax.set_ylabel("peak RSS, MiB (sum of VmHWM)")
        ax.set_title("memory under wrk -c1200", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.suptitle(f"Seed 004 scaling (unpinned) — {subtitle}", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
        plt.close(fig)
        written.append("scaling.png")
    print("\n".join(written))


if __name__ == "__main__":
    main(sys.argv[1])
