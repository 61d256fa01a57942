"""KEDA, real, for the autoscaling tests: its CRDs from its module, its operator and its
metrics adapter built from `github.com/kedacore/keda/v2` (e2e/cluster/build-tools.sh) and run
as host processes.

The adapter is the cluster's external-metrics API: the APIService
`v1beta1.external.metrics.k8s.io` points at a Service without selector whose Endpoints hold
this machine's own non-loopback address (the API server refuses loopback endpoints, and routes
to endpoints with --enable-aggregator-routing, which up.sh sets). The HPA in the real
kube-controller-manager asks that API; the adapter asks KEDA's operator over its mutual-TLS
gRPC; the operator asks Prometheus. `stop` removes the APIService, KEDA's objects and CRDs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import subprocess
import time
from typing import Any

import yaml

from e2e.support.cluster import RUN, Cluster, free_port, tools_bin, wait_established, wait_for
from e2e.support.kueue import _paths

NAMESPACE = "keda"
APISERVICE = "v1beta1.external.metrics.k8s.io"
SERVICE = "keda-metrics-apiserver"


def host_address() -> str:
    """This machine's first global IPv4 address: one the API server reaches and accepts as
    an endpoint."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    raise AssertionError(f"no global IPv4 address on this machine: {out!r}")


def _certificates(where: pathlib.Path, address: str) -> None:
    """A CA and one certificate for the gRPC link (both ends) and the adapter's HTTPS."""
    where.mkdir(parents=True, exist_ok=True)
    if (where / "tls.crt").exists() and address in (where / "san.ext").read_text():
        return

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
        "-subj", "/CN=kimik3-e2e-keda-ca",
        "-keyout", str(where / "ca.key"), "-out", str(where / "ca.crt"))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=keda",
        "-keyout", str(where / "tls.key"), "-out", str(where / "tls.csr"))  # fmt: skip
    (where / "san.ext").write_text(
        f"subjectAltName=IP:127.0.0.1,IP:{address},DNS:localhost,"
        f"DNS:{SERVICE}.{NAMESPACE}.svc,DNS:keda-operator.{NAMESPACE}.svc\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
    )
    run("x509", "-req", "-in", str(where / "tls.csr"), "-CA", str(where / "ca.crt"),
        "-CAkey", str(where / "ca.key"), "-CAcreateserial", "-days", "3650",
        "-extfile", str(where / "san.ext"), "-out", str(where / "tls.crt"))  # fmt: skip


def api_objects(address: str, port: int, ca: bytes) -> list[dict[str, Any]]:
    """The Service, its Endpoints on this machine and the APIService of the adapter."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "subsets": [
                {"addresses": [{"ip": address}], "ports": [{"name": "https", "port": port}]}
            ],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "service": {"name": SERVICE, "namespace": NAMESPACE, "port": 443},
                "caBundle": base64.b64encode(ca).decode(),
            },
        },
    ]


class Keda:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.bin = tools_bin()
        self.crds = pathlib.Path(_paths()["manifests"]) / "keda"
        self.certs = RUN / "keda-certs"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs = {"operator": RUN / "keda-operator.log", "adapter": RUN / "keda-adapter.log"}

    def start(self) -> None:
        for crd in sorted(self.crds.glob("*.yaml")):
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        wait_established(self.cluster, "crd/scaledobjects.keda.sh")
        self.cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        address = host_address()
        _certificates(self.certs, address)
        grpc, health, adapter = free_port(), free_port(), free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        }
        operator = [
            str(self.bin / "keda-operator"),
            "--leader-elect=false",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            f"--metrics-service-bind-address=127.0.0.1:{grpc}",
            f"--cert-dir={self.certs}",
            "--enable-cert-rotation=false",
            "--zap-log-level=info",
        ]
        adapter_args = [
            str(self.bin / "keda-adapter"),
            f"--secure-port={adapter}",
            f"--bind-address={address}",
            f"--cert-dir={self.certs}",
            f"--tls-cert-file={self.certs / 'tls.crt'}",
            f"--tls-private-key-file={self.certs / 'tls.key'}",
            f"--metrics-service-address=127.0.0.1:{grpc}",
            f"--authentication-kubeconfig={self.cluster.kubeconfig}",
            f"--authorization-kubeconfig={self.cluster.kubeconfig}",
            f"--lister-kubeconfig={self.cluster.kubeconfig}",
            "--v=2",
        ]
        for name, args in (("operator", operator), ("adapter", adapter_args)):
            with open(self.logs[name], "ab") as log:
                self.processes.append(
                    subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
                )
        made = api_objects(address, adapter, (self.certs / "ca.crt").read_bytes())
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(made))
        wait_for(self._available, 120, "KEDA's external-metrics API Available", self._logs)

    def _logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{path.read_text()[-2500:]}" for name, path in self.logs.items()
        )

    def _available(self) -> bool:
        for process in self.processes:
            if process.poll() is not None:
                raise AssertionError(f"a KEDA process exited:\n{self._logs()}")
        got = self.cluster.kubectl("get", "apiservice", APISERVICE, "-o", "json", check=False)
        if got.returncode != 0:
            return False
        conditions = json.loads(got.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        """ScaledObjects deleted while KEDA runs (its finalizer), then KEDA, then what it
        registered; the tests after it run on a cluster without KEDA."""
        if self.processes:
            self.cluster.kubectl(
                "delete", "scaledobjects.keda.sh", "--all", "-A", "--timeout=30s", check=False
            )
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15)
            if process.poll() is None:
                process.kill()
                process.wait()
        self.processes = []
        self.cluster.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        listed = self.cluster.kubectl(
            "get", "scaledobjects.keda.sh", "-A", "-o", "json", check=False
        )
        if listed.returncode == 0:
            for item in json.loads(listed.stdout)["items"]:
                meta = item["metadata"]
                self.cluster.kubectl(
                    "patch", "scaledobjects.keda.sh", meta["name"], "-n", meta["namespace"],
                    "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False,
                )  # fmt: skip
        for crd in sorted(self.crds.glob("*.yaml")):
            self.cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", check=False)
        self.cluster.kubectl("delete", "namespace", NAMESPACE, "--timeout=60s", check=False)
        deadline = time.monotonic() + 60
        while (
            self.cluster.kubectl("get", "crd", "scaledobjects.keda.sh", check=False).returncode == 0
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
