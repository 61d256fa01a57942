"""Kueue, real, for the tests that need it: its CRDs from its module, its manager built from
`sigs.k8s.io/kueue/cmd/kueue` (e2e/cluster/build-tools.sh) run as a host process, and its
webhooks called on 127.0.0.1 the way the LeaderWorkerSet manager's are (up.sh).

Only the `leaderworkerset.x-k8s.io/leaderworkerset` and `pod` integrations are on, and their
webhooks see only namespaces labelled ``kimik3.io/e2e-kueue=true``, so the other tests'
pods and LeaderWorkerSets never pass through Kueue. `stop` removes the webhooks and the CRDs,
so the tests after it run on a cluster without Kueue.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import time
from typing import Any

import yaml

from e2e.support.cluster import ROOT, RUN, Cluster, free_port, wait_established, wait_for

NAMESPACE_LABEL = "kimik3.io/e2e-kueue"
# What the KWOK nodes for Kueue carry: their own pool, racks in topology.kimik3.io/domain.
POOL_LABEL = "kimik3.io/e2e-pool"
RACK_LABEL = "topology.kimik3.io/domain"
FEATURE_GATES = {"AdmissionGatedBy": True, "VisibilityOnDemand": False}
KEPT_RESOURCES = {"pods", "leaderworkersets"}
KUEUE_KINDS = (
    "workloads",
    "localqueues",
    "clusterqueues",
    "resourceflavors",
    "topologies",
    "workloadpriorityclasses",
)
PREFIX = "kimik3-e2e-kueue-"
METRICS_CERTS = pathlib.Path("/etc/kueue/metrics/certs")


def _paths() -> dict[str, str]:
    script = f'source {ROOT}/e2e/cluster/paths.sh; echo "$bin"; echo "$manifests"; echo "$run_dir"'
    out = subprocess.run(
        ["bash", "-c", script], check=True, capture_output=True, text=True
    ).stdout.split("\n")
    return {"bin": out[0], "manifests": out[1], "run": out[2]}


def webhook_configurations(source: pathlib.Path, ca: bytes, port: int) -> list[dict[str, Any]]:
    """Kueue's webhook configurations with the webhooks of the two integrations in use and
    of Kueue's own kinds, each calling 127.0.0.1:``port``; the integrations' only in
    namespaces labelled for Kueue."""
    docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
    bundle = base64.b64encode(ca).decode()
    for doc in docs:
        doc["metadata"]["name"] = PREFIX + doc["metadata"]["name"]
        kept = []
        for hook in doc["webhooks"]:
            rule = hook["rules"][0]
            own = rule["apiGroups"] == ["kueue.x-k8s.io"]
            if not own and not set(rule["resources"]) & KEPT_RESOURCES:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            hook["timeoutSeconds"] = 10
            if not own:
                hook["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: "true"}}
            kept.append(hook)
        doc["webhooks"] = kept
    return docs


class Kueue:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        paths = _paths()
        self.binary = pathlib.Path(paths["bin"]) / "kueue"
        self.manifests = pathlib.Path(paths["manifests"])
        self.certs = pathlib.Path(paths["run"]) / "lws-certs"
        self.log = RUN / "kueue.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Kueue serves its metrics with the certificate at this fixed path when it does not
        # manage certificates itself; the webhooks' certificate serves.
        METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            shutil.copyfile(self.certs / name, METRICS_CERTS / name)
        for crd in sorted((self.manifests / "kueue").glob("*.yaml")):
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        wait_established(self.cluster, "crd/workloads.kueue.x-k8s.io")
        wait_established(self.cluster, "crd/topologies.kueue.x-k8s.io")
        self.port, health = free_port(), free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kube-system",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": self.port, "host": "127.0.0.1", "certDir": str(self.certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "true"}},
            "integrations": {"frameworks": ["pod", "leaderworkerset.x-k8s.io/leaderworkerset"]},
            "featureGates": FEATURE_GATES,
        }
        path = RUN / "kueue-config.yaml"
        path.write_text(yaml.safe_dump(config))
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "--config", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
            )
        hooks = webhook_configurations(
            self.manifests / "kueue-webhooks.yaml", (self.certs / "ca.crt").read_bytes(), self.port
        )
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks))
        wait_for(
            lambda: self._ready(health),
            90,
            "Kueue's readiness",
            lambda: self.log.read_text()[-3000:],
        )

    def _ready(self, health: int) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"kueue exited: {self.log.read_text()[-3000:]}")
        probe = subprocess.run(
            ["curl", "-fs", f"http://127.0.0.1:{health}/readyz"], capture_output=True, check=False
        )
        return probe.returncode == 0

    def stop(self) -> None:
        """Kueue's objects deleted while it runs to release its finalizers, then Kueue, then
        (with whatever finalizer is left cleared) its CRDs: none stays Terminating."""
        kinds = ",".join(f"{kind}.kueue.x-k8s.io" for kind in KUEUE_KINDS)
        if self.process is not None:
            self.cluster.kubectl(
                "delete", kinds, "--all", "-A", "--wait=true", "--timeout=30s", check=False
            )
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            name = f"{PREFIX}{kind.replace('webhookconfiguration', '')}-webhook-configuration"
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        if self.process is not None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.process = None
        listed = self.cluster.kubectl("get", kinds, "-A", "-o", "json", check=False)
        if listed.returncode == 0:
            for item in json.loads(listed.stdout)["items"]:
                meta = item["metadata"]
                where = ["-n", meta["namespace"]] if meta.get("namespace") else []
                self.cluster.kubectl(
                    "patch", item["kind"].lower() + ".kueue.x-k8s.io", meta["name"], *where,
                    "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False,
                )  # fmt: skip
        for crd in sorted((self.manifests / "kueue").glob("*.yaml")):
            self.cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", check=False)
        deadline = time.monotonic() + 60
        while (
            self.cluster.kubectl("get", "crd", "workloads.kueue.x-k8s.io", check=False).returncode
            == 0
        ):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)


def quota_objects(gpus: int, flavor: str = "gpu-racks") -> list[dict[str, Any]]:
    """A Topology of racks over hosts, a ResourceFlavor on the Kueue pool's nodes, and a
    ClusterQueue with ``gpus`` GPUs (the other resources the pods ask for, without limit)."""
    api = "kueue.x-k8s.io/v1beta2"
    unlimited = {"cpu": "10k", "memory": "1000Ti", "ephemeral-storage": "1000Pi"}
    return [
        {
            "apiVersion": api,
            "kind": "Topology",
            "metadata": {"name": "racks"},
            "spec": {
                "levels": [{"nodeLabel": RACK_LABEL}, {"nodeLabel": "kubernetes.io/hostname"}]
            },
        },
        {
            "apiVersion": api,
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {
                "nodeLabels": {POOL_LABEL: "kueue"},
                "topologyName": "racks",
            },
        },
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": "gpus"},
            "spec": {
                "namespaceSelector": {},
                # A Workload of a higher WorkloadPriorityClass takes a lower one's quota.
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu", *unlimited],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "nvidia.com/gpu", "nominalQuota": gpus},
                                    *(
                                        {"name": name, "nominalQuota": amount}
                                        for name, amount in unlimited.items()
                                    ),
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    ]


def priority_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in (("batch", 10), ("serving", 1000))
    ]


def local_queue(namespace: str, name: str = "gpus") -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": "gpus"},
    }
