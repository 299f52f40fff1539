"""Helpers shared by the benchmark scripts (bench/dataplane/run, bench/nfr/run)."""

import os
import shutil
import subprocess
import sys


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
