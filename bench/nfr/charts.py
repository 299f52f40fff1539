"""Charts of bench/nfr/run, drawn from results.json and samples.jsonl in the report directory:

    scaling.png          request rate per load in each scaling phase, events and replicas marked
    soak.png             request rate over the soak, churn events marked
    backend-failure.png  requests per second around the backend kill
    resources.png        data-plane and control-plane CPU, RSS, descriptors, connections

Runs under a Python with matplotlib (bench/common.py chart_python).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = sys.argv[1]
with open(os.path.join(OUT, "results.json")) as f:
    R = json.load(f)
SAMPLES = []
with open(os.path.join(OUT, "samples.jsonl")) as f:
    for line in f:
        SAMPLES.append(json.loads(line))
UNIX0 = R["unix0"]
COLORS = {"http": "tab:blue", "https": "tab:green", "http-close": "tab:purple",
          "https-close": "tab:olive"}


def rate_axes(ax, phase, t0):
    """Requests/s per load (t relative to the phase start), non-2xx in red, events."""
    for label, r in phase["loads"].items():
        xs, ok, bad = [], [], []
        for sec, (o, b) in sorted(r["series"].items(), key=lambda kv: int(kv[0])):
            xs.append(int(sec) - UNIX0 - t0)
            ok.append(o)
            bad.append(b)
        ax.plot(xs, ok, label=f"{label} 2xx/s", color=COLORS.get(label), linewidth=1)
        if any(bad):
            ax.plot(xs, bad, label=f"{label} non-2xx/s", color="tab:red", linewidth=1.5)
    for e in R["events"]:
        if e["phase"] == phase["name"]:
            ax.axvline(e["t"] - t0, color="grey", linestyle=":", linewidth=0.8)
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def replicas_axes(ax, phase):
    t0, t1 = phase["t0"], phase["t1"]
    pts = [(s["t"] - t0, s["dataplane"]["n"]) for s in SAMPLES if t0 <= s["t"] <= t1]
    if pts:
        ax2 = ax.twinx()
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], color="black", linestyle="--",
                 linewidth=1, label="data-plane processes")
        ax2.set_ylabel("data-plane processes")
        ax2.set_ylim(bottom=0)


def failed(phase):
    return sum(r["failed"] for r in phase["loads"].values())


def scaling():
    phases = [p for p in R["phases"] if p["name"] not in ("soak",)]
    if not phases:
        return
    fig, axes = plt.subplots(len(phases), 1, figsize=(11, 3.2 * len(phases)), squeeze=False)
    for ax, p in zip(axes[:, 0], phases):
        rate_axes(ax, p, p["t0"])
        replicas_axes(ax, p)
        ax.set_title(f"{p['name']}: {p['title']} — {failed(p)} failed", fontsize=10)
        ax.legend(fontsize=7, loc="lower left", ncol=4)
    axes[-1, 0].set_xlabel("seconds since the phase's load started")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "scaling.png"), dpi=90)
    plt.close(fig)


def one_phase(name, png, title, mark_unix=None):
    """Requests per second over one phase (with its events; `mark_unix` drawn in red)."""
    p = next((p for p in R["phases"] if p["name"] == name), None)
    if not p:
        return
    fig, ax = plt.subplots(figsize=(11, 3.5))
    rate_axes(ax, p, p["t0"])
    if mark_unix is not None:
        ax.axvline(p[mark_unix] - UNIX0 - p["t0"], color="tab:red", linewidth=1)
    ax.set_title(f"{title(p)} — {failed(p)} failed", fontsize=10)
    ax.set_xlabel("seconds since the phase's load started")
    ax.legend(fontsize=7, loc="lower left", ncol=4)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, png), dpi=90)
    plt.close(fig)


def resources():
    if not SAMPLES:
        return
    ts = [s["t"] for s in SAMPLES]
    fig, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True)
    for ax, (key, title, scale) in zip(axes, (("cpu", "CPU (% of one core)", 1),
                                              ("rss_kib", "RSS (MiB)", 1 / 1024),
                                              ("fds", "open file descriptors", 1),
                                              ("conns", "established TCP connections", 1))):
        for role, color in (("dataplane", "tab:blue"), ("controller", "tab:orange")):
            ax.plot(ts, [s[role][key] * scale for s in SAMPLES], label=role, color=color,
                    linewidth=0.8)
        ax.set_ylabel(title, fontsize=8)
        ax.grid(alpha=0.3)
        for i, p in enumerate(R["phases"]):
            ax.axvspan(p["t0"], p["t1"], color="grey" if i % 2 else "silver", alpha=0.15)
        ax.legend(fontsize=7, loc="upper left")
    for p in R["phases"]:
        axes[0].text(p["t0"], axes[0].get_ylim()[1] * 0.95, p["name"], fontsize=7, va="top")
    axes[-1].set_xlabel("seconds since the run started (data plane: summed over its replicas)")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "resources.png"), dpi=90)
    plt.close(fig)


scaling()
one_phase("soak", "soak.png", lambda p: f"soak: {p['title']} (dotted: churn events)")
one_phase("backend", "backend-failure.png", lambda p: "backend SIGKILL under load",
          mark_unix="kill_unix")
resources()
