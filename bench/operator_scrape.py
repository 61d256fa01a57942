"""CPU and memory of the real operator process (`kimik3 run`) while it serves 10
KimiK3Deployments of 10 single-node groups each, 100 Ready leaders, and scrapes all of them
every 30 s. Runs on the local control plane (make cluster-up; it adds fake GPU nodes so the
100 leaders fit). KWOK pods have no network, so KIMIK3_SCRAPE_URL points the scrapes at one
process serving a fake vLLM leader per pod (e2e/support/vllm_exporter.py). Prints figures; asserts
nothing.

    .venv/bin/python bench/operator_scrape.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from e2e.support.cluster import tools_bin  # noqa: E402 - after the path

KUBECONFIG = ROOT / "e2e" / ".run" / "kubeconfig"
NAMESPACE = "bench-scrape"
SERVER = textwrap.dedent("""
    import sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from e2e.support.vllm_exporter import FakeLeader
    leaders = {}
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            name = self.path.strip("/")
            leader = leaders.setdefault(name, FakeLeader(started=time.time() - 600))
            body = leader.exposition().encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
""")


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--port", type=int, default=19501)
    args = parser.parse_args()
    tools = tools_bin()
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG), "PATH": f"{tools}:{os.environ['PATH']}"}

    def kubectl(*a: str, stdin: str | None = None) -> str:
        return subprocess.run(
            ["kubectl", *a], input=stdin, env=env, check=True, capture_output=True, text=True
        ).stdout

    nodes = subprocess.run(
        [sys.executable, str(ROOT / "e2e/cluster/nodes.py"), "--count", "104"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    kubectl("apply", "-f", "-", stdin=nodes)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests/crd"))
    kubectl("create", "namespace", NAMESPACE)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.port)], cwd=ROOT)
    operator = subprocess.Popen(
        [sys.executable, "-m", "kimik3_operator", "run"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={
            **env,
            "KIMIK3_NAMESPACES": NAMESPACE,
            "KIMIK3_METRICS_PORT": "0",
            "KIMIK3_HEALTH_ENDPOINT": "http://127.0.0.1:18098/healthz",
            "KIMIK3_SCRAPE_URL": f"http://127.0.0.1:{args.port}/{{pod}}",
        },
    )
    try:
        for d in range(10):
            kubectl(
                "apply",
                "-n",
                NAMESPACE,
                "-f",
                "-",
                stdin=json.dumps(
                    {
                        "apiVersion": "serving.kimik3.io/v1alpha1",
                        "kind": "KimiK3Deployment",
                        "metadata": {"name": f"d{d}"},
                        "spec": {
                            "replicas": 10,
                            "parallelism": {"tensor": 8},
                            "preflight": {"probe": False},
                        },
                    }
                ),
            )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ready = sum(
                json.loads(kubectl("get", "kk3d", "-n", NAMESPACE, "-o", "json"))["items"][i]
                .get("status", {})
                .get("readyReplicas", 0)
                for i in range(10)
            )
            if ready == 100:
                break
            time.sleep(2)
        print(f"100 groups ready; measuring the operator for {args.seconds:.0f}s")
        start_cpu, start = cpu_seconds(operator.pid), time.monotonic()
        peak = 0.0
        while time.monotonic() - start < args.seconds:
            time.sleep(5)
            peak = max(peak, rss_mib(operator.pid))
        used = cpu_seconds(operator.pid) - start_cpu
        elapsed = time.monotonic() - start
        scraped = (
            json.loads(kubectl("get", "kk3d", "d0", "-n", NAMESPACE, "-o", "json"))["status"]
            .get("speculative", {})
            .get("acceptanceRate")
        )
        print(
            f"operator: {used / elapsed:.1%} of a core on average over {elapsed:.0f}s "
            f"(10 deployments, 100 leaders, scrape and resync every 30 s); peak RSS "
            f"{peak:.0f} MiB; d0 acceptanceRate {scraped}"
        )
    finally:
        operator.terminate()
        operator.wait(timeout=20)
        server.terminate()
        kubectl("delete", "namespace", NAMESPACE, "--wait=false")
        # Leave the cluster as cluster-up made it: the end-to-end tests count on 4 nodes.
        extra = [f"gpu-node-{i}" for i in range(4, 104)]
        kubectl("delete", "node", "--wait=false", *extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
