"""The real control plane as the end-to-end tests and the benchmarks use it: the cluster and
kubectl, the session's namespaces, the operator as a process, waiting for conditions, and a
KimiK3Deployment to apply."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml

from e2e.support.play_probe import terminated_patch
from kimik3_operator.api.types import DEFAULT_USER as JOB_GROUP

ROOT = pathlib.Path(__file__).resolve().parents[2]


RUN = ROOT / "e2e" / ".run"


CACHE_KEY_LABEL = "serving.kimik3.io/cache-key"


KUBECONFIG = RUN / "kubeconfig"


CRD = ROOT / "manifests" / "crd" / "kimik3deployments.yaml"


API = "kimik3deployments.serving.kimik3.io"


def tools_bin() -> pathlib.Path:
    out = subprocess.run(
        ["bash", str(ROOT / "e2e/cluster/build-tools.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return pathlib.Path(out.stdout.strip().splitlines()[-1])


class Cluster:
    def __init__(self, kubeconfig: pathlib.Path, bin_dir: pathlib.Path) -> None:
        self.kubeconfig = kubeconfig
        self.bin_dir = bin_dir
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        }

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def items(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        items: list[dict[str, Any]] = json.loads(self.kubectl(*args).stdout)["items"]
        return items

    def events(
        self, namespace: str, field_selector: str, timeout: float = 20
    ) -> list[dict[str, Any]]:
        """The events that match, waited for: the operator posts a condition's event just
        after the status patch that a test's wait has already seen."""
        args = ("get", "events", "-n", namespace, "--field-selector", field_selector, "-o", "json")

        def listed() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = json.loads(self.kubectl(*args).stdout)["items"]
            return items

        found: list[dict[str, Any]] = wait_for(listed, timeout, f"events with {field_selector}")
        return found

    def apply(
        self, manifest: dict[str, Any], namespace: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=check
        )


TEST_NAMESPACE_LABEL = "kimik3.io/e2e-test"


# The value this session labels its namespaces with: `make test` runs the KWOK and the real
# tier side by side, and each session removes (and checks) only its own.
SESSION = os.environ.get("KIMIK3_E2E_SESSION", "true")


def create_test_namespace(cluster: Cluster, name: str) -> str:
    """A namespace the session deletes at its end, whatever the test did."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: SESSION}},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    return name


def remove_test_namespaces(cluster: Cluster, timeout: int = 180) -> list[str]:
    """Deletes this session's test namespaces, waits until they are gone, and returns any of
    them still there afterwards, Terminating or not (none, when nothing holds a finalizer)."""
    selector = f"{TEST_NAMESPACE_LABEL}={SESSION}"
    cluster.kubectl("delete", "namespace", "-l", selector, "--wait=false", check=False)
    # Real vLLM pods may take their whole grace period (120 s) to stop: the wait's own
    # timeout, not the call's, decides.
    cluster.kubectl(
        "wait",
        "--for=delete",
        "namespace",
        "-l",
        selector,
        f"--timeout={timeout}s",
        check=False,
        timeout=timeout + 30,
    )
    listed = json.loads(cluster.kubectl("get", "namespaces", "-o", "json").stdout)["items"]
    left = []
    for ns in listed:
        labels = ns["metadata"].get("labels") or {}
        terminating = ns.get("status", {}).get("phase") == "Terminating"
        # Ours, or a namespace no session labelled (the demo's) hanging in Terminating; the
        # other session's are its own to check.
        if labels.get(TEST_NAMESPACE_LABEL) == SESSION or (
            terminating and TEST_NAMESPACE_LABEL not in labels
        ):
            left.append(ns["metadata"]["name"])
    return left


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OperatorProcess:
    """`kimik3 run` as a real process against a kubeconfig, watching one namespace."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        kubeconfig: pathlib.Path | None = None,
        extra_env: dict[str, str] | None = None,
        label: str = "",
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.extra_env = extra_env or {}
        self.log = RUN / f"operator-{namespace}{label}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        health = f"http://127.0.0.1:{free_port()}/healthz"
        self.metrics_port = free_port()
        env = {
            **self.cluster.env,
            "KIMIK3_NAMESPACES": self.namespace,
            "KIMIK3_RESYNC_SECONDS": "5",
            "KIMIK3_HEALTH_ENDPOINT": health,
            "KIMIK3_METRICS_PORT": str(self.metrics_port),
            "KIMIK3_METRICS_ADDRESS": "127.0.0.1",
            # KWOK's pod IPs are made up: never send the acceptance scrape there. Nothing
            # listens on port 9, so a test that wants metrics sets its own exporter's URL.
            "KIMIK3_SCRAPE_URL": "http://127.0.0.1:9/{pod}",
            "KUBECONFIG": str(self.kubeconfig),
            **self.extra_env,
        }
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kimik3_operator", "run", "--verbose"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"operator exited: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                import urllib.request

                with urllib.request.urlopen(health, timeout=1):
                    return
            time.sleep(0.3)
        raise AssertionError(f"operator not healthy in 30s: {self.log.read_text()[-3000:]}")

    def metric(self, series: str) -> float:
        """The value of one series (name and labels, as exposed) of the running process."""
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(series):
                    return float(line.split()[-1])
        return 0.0

    def metrics_text(self, prefix: str = "") -> str:
        """The lines of the running process's metrics that start with ``prefix``."""
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            lines = response.read().decode().splitlines()
        return "\n".join(line for line in lines if line.startswith(prefix))

    def reconciles(self) -> float:
        """kimik3_reconciles_total{result="ok"} of the running process."""
        return self.metric('kimik3_reconciles_total{result="ok"}')

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def describe(cluster: Cluster, name: str, namespace: str) -> str:
    """What a failing wait shows: the resource's conditions and events, the pods."""
    body = cluster.get("kk3d", name, namespace) or {}
    conditions = json.dumps(body.get("status", {}).get("conditions", []), indent=1)
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False
    ).stdout
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    return f"conditions of {namespace}/{name}:\n{conditions}\nevents:\n{events}\npods:\n{pods}"


def wait_established(cluster: Cluster, crd: str, timeout: float = 60) -> None:
    """Until the CRD is Established. `kubectl wait` fails outright, instead of waiting, on a
    CRD the API server has not yet given any condition."""
    established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + timeout
    while cluster.kubectl("get", crd, "-o", established, check=False).stdout != "True":
        if time.monotonic() > deadline:
            raise AssertionError(f"{crd} not Established in {timeout:.0f}s")
        time.sleep(0.2)


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, explain: Callable[[], str] = lambda: ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{explain()}")
        time.sleep(0.5)


def condition(body: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in (body or {}).get("status", {}).get("conditions", []) or []:
        if cond.get("type") == type_:
            found: dict[str, Any] = cond
            return found
    return {}


def kimi(name: str = "k3", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def service_account_kubeconfig(
    cluster: Cluster, namespace: str, account: str, path: pathlib.Path
) -> pathlib.Path:
    """A kubeconfig that acts as a ServiceAccount, so a host process has exactly its RBAC."""
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, "--duration=2h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def cache_volume(
    cluster: Cluster, namespace: str, claim: str, path: pathlib.Path, capacity: str = "1Gi"
) -> None:
    """A hostPath volume reserved for the claim the operator will create (no provisioner).
    Its directory is left as a provisioner that applies the pods' fsGroup leaves a volume
    (the kubelet applies none to hostPath): owned by the group the operator's Jobs run as,
    writable by it, new files inheriting it."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, -1, JOB_GROUP)
    path.chmod(0o2775)
    name = f"cache-{namespace}"
    manifest = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"kimik3.io/e2e-test": "true"}},
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    cluster.apply(manifest, namespace)


def play_download(
    cluster: Cluster, namespace: str, key: str, report: dict[str, Any], label: str = CACHE_KEY_LABEL
) -> str:
    """Writes the download's (or the collection's) report into its finished pod, as the real
    script does."""

    def finished() -> dict[str, Any] | None:
        pods = cluster.items("pod", namespace, f"{label}={key}")
        done = [p for p in pods if p["status"].get("phase") == "Succeeded"]
        return done[0] if done else None

    pod = wait_for(finished, 60, f"the download pod for {key} to finish")
    cluster.kubectl(*terminated_patch(pod, json.dumps(report)))
    name: str = pod["metadata"]["name"]
    return name
