"""Helpers shared by the benchmark scripts (bench/dataplane/run, bench/nfr/run,
bench/controlplane/run, standalone and seed001, bench/provisioned/memory)."""

import os
import random
import re
import shutil
import socket
import subprocess
import sys


def free_ports(n):
    """n distinct free ports below the ephemeral range (32768-60999), where client sockets (the
    API server's, wrk's, the backends') land: a port picked there can be taken again before it
    is bound. Each is held until all are picked, so none repeats."""
    socks, ports = [], []
    while len(ports) < n:
        p = random.randint(20000, 32000)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            s.close()
            continue
        socks.append(s)
        ports.append(p)
    for s in socks:
        s.close()
    return ports


def control_plane_bench():
    """bench/controlplane/run (a script without a .py name) as a module: its cluster, API
    client, echo host, process and provisioning helpers, for the other control-plane
    benchmarks."""
    import importlib.machinery
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "controlplane", "run")
    loader = importlib.machinery.SourceFileLoader("cp_run", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("cp_run", loader))
    loader.exec_module(module)
    return module


def proc_memory_kib(pid):
    """VmRSS and its anonymous and file-backed parts (RssAnon, RssFile) of one process, KiB.
    The file-backed part is the binary's code the kernel mapped (in blocks around each page
    touched), not the configuration: benchmarks report it apart."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0])
    return out


def chart_python(root, log):
    """A Python that can import matplotlib: the system one, else bench/.venv (created once,
    with pip from the package index; python3-venv from apt when the system lacks it)."""
    for py in (sys.executable, "python3"):
        if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            return py
    venv = os.path.join(root, "bench", ".venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        log("creating bench/.venv for matplotlib")
        r = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if r.returncode != 0 and os.geteuid() == 0 and shutil.which("apt-get"):
            subprocess.run(["apt-get", "install", "-y", "-qq", "python3-venv"], check=True,
                           stdout=subprocess.DEVNULL)
            shutil.rmtree(venv, ignore_errors=True)
            r = subprocess.run(["python3", "-m", "venv", venv], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"cannot create {venv}: {r.stderr.strip()}")
    if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        log("pip install matplotlib into bench/.venv")
        subprocess.run([py, "-m", "pip", "install", "-q", "matplotlib"], check=True)
    return py


UNIT = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def parse_wrk(out):
    """wrk's summary: rate, requests, errors (socket errors by kind, non-2xx) and the latency
    percentiles of --latency in milliseconds. `requests` is None when wrk printed no summary."""
    r = {"rps": None, "requests": None, "errors": 0, "non2xx": 0, "socket_errors": 0,
         "connect": 0, "read": 0, "write": 0, "timeouts": 0, "latency": {}}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        r["rps"] = float(m.group(1))
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
    if m:
        r["requests"] = int(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if m:
        r["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        r["connect"], r["read"], r["write"], r["timeouts"] = map(int, m.groups())
        r["socket_errors"] = sum(int(x) for x in m.groups())
    r["errors"] = r["non2xx"] + r["socket_errors"]
    for p, v, u in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M):
        r["latency"][int(p)] = float(v) * UNIT[u]
    return r


def pct(xs, p):
    """Nearest-rank percentile of a list (None when empty)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def write_atomic(path, text):
    """Writes a file the way a watcher should see it: a temp file beside it, then a rename."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


# The stages of a reconcile pass in gatehouse run -f (status_queue is the controller's).
STAGES = ("snapshot", "translate", "compare", "apply", "status")


def stage_totals(metrics_text):
    """{stage: (seconds summed, passes)} from gatehouse_config_pass_stage_duration_seconds in
    a /metrics text."""
    out = {}
    for line in metrics_text.splitlines():
        if not line.startswith("gatehouse_config_pass_stage_duration_seconds_"):
            continue
        name, value = line.rsplit(" ", 1)
        for stage in STAGES:
            if f'stage="{stage}"' in name:
                total, count = out.get(stage, (0.0, 0))
                if name.startswith("gatehouse_config_pass_stage_duration_seconds_sum"):
                    total = float(value)
                elif name.startswith("gatehouse_config_pass_stage_duration_seconds_count"):
                    count = int(float(value))
                out[stage] = (total, count)
    return out
