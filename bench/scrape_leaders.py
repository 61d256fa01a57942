"""CPU and memory of the operator's acceptance scraping for N leaders (default 100) on a 30 s
interval. The leaders are fake vLLM exporters (e2e/support/vllm_exporter.py) served by a separate
process on 127.0.0.1, one path each; the measured process runs the operator's real acceptance reader
(HTTP fetch, parse with prometheus_client, windows, aggregation, status decision) against
an in-memory API, ten deployments of N/10 leaders. Prints figures; asserts nothing.

    .venv/bin/python bench/scrape_leaders.py [--leaders 100] [--ticks 5]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import textwrap
import time
import urllib.request

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator" / "tests")]

from conftest import FakeKube  # noqa: E402 - the unit tier's fake API
from conftest import resource as kk3d  # noqa: E402
from kimik3_operator.runtime.readers import AcceptanceReader  # noqa: E402

SERVER = textwrap.dedent("""
    import sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from e2e.support.vllm_exporter import FakeLeader
    leaders = {f"leader-{i}": FakeLeader(started=time.time() - 600,
               drafts_per_second=5 + i % 7) for i in range(int(sys.argv[2]))}
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = leaders[self.path.strip("/")].exposition().encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
""")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leaders", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--port", type=int, default=19500)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.port), str(args.leaders)], cwd=ROOT
    )
    try:
        for _ in range(50):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/leader-0", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        kube = FakeKube()
        deployments = 10
        per = args.leaders // deployments
        for d in range(deployments):
            kube.put(kk3d(f"d{d}"))
            for i in range(per):
                kube.put(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"leader-{d * per + i}",
                            "namespace": "llm",
                            "labels": {
                                "app.kubernetes.io/instance": f"d{d}",
                                "app.kubernetes.io/component": "leader",
                                "app.kubernetes.io/managed-by": "kimik3-operator",
                            },
                        },
                        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                    }
                )
        reader = AcceptanceReader(url_override=f"http://127.0.0.1:{args.port}/{{pod}}")
        bodies = [
            kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", f"d{d}", "llm")
            for d in range(deployments)
        ]
        cpu, wall = [], []
        for _ in range(args.ticks):
            started_cpu, started = time.process_time(), time.perf_counter()
            for body in bodies:
                assert body is not None
                reader.tick(kube, body)
            cpu.append(time.process_time() - started_cpu)
            wall.append(time.perf_counter() - started)
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        per_tick = sorted(cpu)[len(cpu) // 2]
        print(
            f"{args.leaders} leaders in {deployments} deployments, {args.ticks} ticks: "
            f"median {per_tick * 1000:.0f} ms CPU and {sorted(wall)[len(wall) // 2] * 1000:.0f}"
            f" ms wall per tick; at one tick per 30 s that is {per_tick / 30:.2%} of a core; "
            f"peak RSS {rss_mib:.0f} MiB"
        )
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
