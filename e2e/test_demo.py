"""The README's first command, as a user runs it: `make demo`'s script brings the sample
deployment to Available (the probe and the download played, as KWOK runs no container) and
shows the incompatible example refused, on a fresh demo and again on a running one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from e2e.support.cluster import ROOT, RUN, Cluster

pytestmark = pytest.mark.kwok


def stop_demo(cluster: Cluster) -> None:
    """The demo stays up by design; the suite's other tests run without it."""
    for process in ("operator", "exporter"):
        pidfile = RUN / f"{process}.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            pidfile.unlink()
    # Gone before the next run or test: a namespace still terminating refuses new objects.
    cluster.kubectl("delete", "namespace", "kimik3-demo", "--timeout=180s", check=False)
    cluster.kubectl("delete", "pv", "cache-kimik3-demo", "--wait=false", check=False)
    cluster.kubectl("delete", "node", "-l", "kimik3.io/pool=demo", check=False)


def test_the_demo_runs_and_runs_again(cluster: Cluster) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    stop_demo(cluster)
    try:
        _run_twice(env)
    finally:
        stop_demo(cluster)


def _run_twice(env: dict[str, str]) -> None:
    for run in ("first", "again"):
        done = subprocess.run(
            ["bash", str(ROOT / "e2e" / "demo.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"{run}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        assert "Available=True Available" in done.stdout, run
        assert "CapabilitiesVerified=False TargetLacksEagle3" in done.stdout, run
        assert "LeaderWorkerSets for kimi-k3-old: 0" in done.stdout, run
