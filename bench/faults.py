"""Faults the operator must ride out, on the local control plane (make cluster-up):

1. the API server stopped for 30 s and started again: the operator keeps its process and
   applies a change made after the API server is back;
2. the LeaderWorkerSet controller stopped while a group's pods are deleted: the status names
   the group that is down, and everything is Available again once the controller is back;
3. ``--specs`` generated invalid or hostile specs (hypothesis) sent through the real API
   server: how many the schema refuses, operator crashes, and partial child sets (a
   LeaderWorkerSet without its Service or the other way round) among those it accepts.

(kill -9 of the operator under load is in bench/scale.py; a node deleted under a running
group is the end-to-end test test_a_node_deleted_under_a_running_group_...) Prints figures;
asserts nothing.

    .venv/bin/python bench/faults.py [--outage 30] [--specs 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from e2e.support.cluster import (  # noqa: E402
    Cluster,
    OperatorProcess,
    create_test_namespace,
    service_account_kubeconfig,
    tools_bin,
)
from kimik3_operator.kube import ApiKube, KubeError  # noqa: E402

RUN = ROOT / "e2e" / ".run"
KUBECONFIG = RUN / "kubeconfig"
AUDIT = RUN / "kwok" / "clusters" / "kimik3-e2e" / "logs" / "audit.log"
# The identity the cluster's audit policy records (e2e/cluster/up.sh).
AUDITED_NS, AUDITED_ACCOUNT = "kimik3-bench", "kimik3-operator"
AUDITED_USER = f"system:serviceaccount:{AUDITED_NS}:{AUDITED_ACCOUNT}"
API = "serving.kimik3.io/v1alpha1"
SMALL = {
    "replicas": 1,
    "parallelism": {"tensor": 16},
    "preflight": {"probe": False},
}


def wait(predicate: Callable[[], Any], timeout: float, step: float = 0.25) -> float:
    """Seconds until ``predicate`` holds, or NaN after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if predicate():
                return time.monotonic() - start
        except Exception:  # the API server away: connection refused, retries exhausted
            pass
        time.sleep(step)
    return float("nan")


def condition(api: ApiKube, ns: str, name: str, kind: str) -> dict[str, Any]:
    body = api.get(API, "KimiK3Deployment", name, ns) or {}
    for cond in body.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            found: dict[str, Any] = cond
            return found
    return {}


def deploy_available(api: ApiKube, ns: str) -> None:
    """One small deployment, k3, waited on until Available."""
    api.create(
        {
            "apiVersion": API,
            "kind": "KimiK3Deployment",
            "metadata": {"name": "k3", "namespace": ns},
            "spec": SMALL,
        }
    )
    wait(lambda: condition(api, ns, "k3", "Available").get("status") == "True", 120)


def control_plane() -> dict[str, tuple[int, list[str], dict[str, str], str]]:
    """kwokctl's control-plane processes by binary name: pid, argv, environment, cwd."""
    found = {}
    bin_dir = str(RUN / "kwok" / "clusters" / "kimik3-e2e" / "bin")
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            if not argv or not argv[0].startswith(bin_dir):
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
            env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
            found[pathlib.Path(argv[0]).name] = (
                int(proc.name),
                argv,
                env,
                os.readlink(proc / "cwd"),
            )
        except OSError:
            continue
    return found


def restart(argv: list[str], env: dict[str, str], cwd: str) -> None:
    with open(RUN / f"{pathlib.Path(argv[0]).name}-restarted.log", "ab") as log:
        subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=log, start_new_session=True)


def audited_requests(offset: int) -> tuple[Counter[str], set[str]]:
    """The LISTs (by collection) and the watches the audited identity made after ``offset``
    bytes of the API server's audit log: the server's own record, not the client's."""
    lists: Counter[str] = Counter()
    watches: set[str] = set()
    with open(AUDIT, "rb") as log:
        log.seek(offset)
        for line in log:
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != AUDITED_USER:
                continue
            if event.get("stage") != "ResponseStarted" and event.get("verb") == "watch":
                continue  # a watch is counted once, when it starts
            if event.get("stage") not in ("ResponseComplete", "ResponseStarted"):
                continue
            collection = str(event.get("requestURI", "")).split("?", 1)[0]
            if event.get("verb") == "watch":
                watches.add(collection)
            elif event.get("verb") == "list" and "continue=" not in event.get("requestURI", ""):
                lists[collection] += 1
    return lists, watches


def audited_operator(cluster: Cluster, ns: str) -> OperatorProcess:
    """The operator acting as the ServiceAccount the audit policy records."""
    cluster.kubectl("create", "namespace", AUDITED_NS, check=False)
    cluster.kubectl("create", "serviceaccount", AUDITED_ACCOUNT, "-n", AUDITED_NS, check=False)
    cluster.kubectl(
        "create", "clusterrolebinding", "kimik3-bench", "--clusterrole=cluster-admin",
        f"--serviceaccount={AUDITED_NS}:{AUDITED_ACCOUNT}", check=False,
    )  # fmt: skip
    config = service_account_kubeconfig(
        cluster, AUDITED_NS, AUDITED_ACCOUNT, RUN / "faults-sa.kubeconfig"
    )
    return OperatorProcess(cluster, ns, kubeconfig=config, label="-outage")


def outage(cluster: Cluster, api: ApiKube, seconds: float) -> None:
    ns = create_test_namespace(cluster, "fault-outage")
    operator = audited_operator(cluster, ns)
    operator.start()
    try:
        deploy_available(api, ns)
        assert operator.process is not None
        pid = operator.process.pid
        before = control_plane()
        apiserver, argv, env, cwd = before["kube-apiserver"]
        offset = AUDIT.stat().st_size
        os.kill(apiserver, signal.SIGKILL)  # SIGTERM drains watches for minutes
        down = time.monotonic()
        time.sleep(seconds)
        restart(argv, env, cwd)
        back = wait(lambda: api.get(API, "KimiK3Deployment", "k3", ns) is not None, 120)
        print(f"API server stopped for {time.monotonic() - down - back:.0f}s; serving again")
        # The controller manager and the scheduler exit when they lose the API server for
        # long (their leases lapse); kwokctl does not restart them, so do it here.
        after = control_plane()
        for name, (_, other_argv, other_env, other_cwd) in before.items():
            if name not in after:
                restart(other_argv, other_env, other_cwd)
                print(f"  restarted {name}, which exited while the API server was away")
        changed = time.monotonic()
        api.patch(API, "KimiK3Deployment", "k3", ns, {"spec": {"replicas": 2}})
        took = wait(
            lambda: (
                (api.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", ns) or {})
                .get("spec", {})
                .get("replicas")
                == 2
            ),
            120,
        )
        time.sleep(10)  # let every informer come back
        lists, watches = audited_requests(offset)
        print(
            f"after the outage: {sum(lists.values())} LIST requests for {len(watches)} watched "
            f"collections (most for one: {max(lists.values(), default=0)}), from the API "
            "server's audit log"
        )
        for collection, times in sorted(lists.items()):
            if times > 1:
                print(f"  listed {times} times: {collection}")
        alive = operator.process.poll() is None and operator.process.pid == pid
        print(
            f"after the outage: a spec change reached the LeaderWorkerSet in {took:.1f}s "
            f"({time.monotonic() - changed:.1f}s); operator process the same and alive: {alive}"
        )
    finally:
        operator.stop()
        # Free its GPUs for the next scenario.
        cluster.kubectl("delete", "namespace", ns, "--timeout=120s", check=False)


def up() -> None:
    """e2e/cluster/up.sh: reuses what runs, starts the LWS manager when it does not."""
    subprocess.run(
        ["bash", str(ROOT / "e2e/cluster/up.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        check=True,
    )


def lws_stopped(cluster: Cluster, api: ApiKube) -> None:
    up()
    ns = create_test_namespace(cluster, "fault-lws")
    operator = OperatorProcess(cluster, ns, label="-lws")
    operator.start()
    pid_file = RUN / "lws.pid"
    try:
        deploy_available(api, ns)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        pid_file.unlink()
        stopped = time.monotonic()
        for pod in api.list("v1", "Pod", ns, label_selector="app.kubernetes.io/instance=k3"):
            api.delete("v1", "Pod", pod["metadata"]["name"], ns)
        noticed = wait(
            lambda: (
                condition(api, ns, "k3", "Available").get("status") == "False"
                and "group 0" in condition(api, ns, "k3", "Available").get("message", "")
            ),
            60,
        )
        message = condition(api, ns, "k3", "Available").get("message", "")
        print(
            f"LWS controller stopped, the group's pods deleted: Available=False naming the "
            f"group after {noticed:.1f}s: {message!r}"
        )
        time.sleep(max(0.0, 20 - (time.monotonic() - stopped)))
        up()
        restarted = time.monotonic()
        took = wait(lambda: condition(api, ns, "k3", "Available").get("status") == "True", 180)
        lws = api.list("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", ns)
        pods = api.list("v1", "Pod", ns, label_selector="app.kubernetes.io/instance=k3")
        print(
            f"LWS controller back: Available again after {took:.1f}s "
            f"({time.monotonic() - restarted:.0f}s); LeaderWorkerSets {len(lws)}, pods "
            f"{len(pods)} (expected 1 and 2)"
        )
    finally:
        operator.stop()


SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=300),
    st.sampled_from(
        ["", "0", "-1", "Enforce", "nvidia", "none", "dspark", "../../etc", "a" * 5000]
    ),
)
JSONISH = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=4),
    max_leaves=12,
)  # fmt: skip
FIELDS = {
    "replicas": st.integers(-3, 70) | JSONISH,
    "model": st.fixed_dictionaries(
        {},
        optional={
            "repo": st.sampled_from(["moonshotai/Kimi-K3", "", "x" * 400, "a/b"]) | JSONISH,
            "revision": st.text(max_size=50) | JSONISH,
            "architecture": st.sampled_from(
                ["KimiLinearForCausalLM", "KimiK3ForConditionalGeneration", "Nope"]
            ) | JSONISH,
            "source": st.fixed_dictionaries({}, optional={
                "pvc": st.fixed_dictionaries({}, optional={"claimName": st.text(max_size=70),
                                                           "path": st.text(max_size=70)}),
                "huggingFace": st.just({})}) | JSONISH,
            "hfTokenSecretRef": st.fixed_dictionaries({}, optional={
                "name": st.text(max_size=70), "key": st.text(max_size=70)}),
        },
    ),
    "drafter": st.fixed_dictionaries(
        {},
        optional={
            "method": st.sampled_from(["dspark", "eagle3", "dflash", "mtp", "none", "x"]),
            "repo": st.sampled_from(["", "RedHatAI/Kimi-K3-speculator.dspark", "a/b"]),
            "numSpeculativeTokens": st.integers(-2, 100) | JSONISH,
            "draftTensorParallelSize": st.integers(-1, 64),
            "draftSampleMethod": st.sampled_from(["greedy", "probabilistic", "?"]),
            "rejectionSampleMethod": st.sampled_from(["standard", "synthetic", "block", "?"]),
        },
    ),
    "engine": st.fixed_dictionaries(
        {},
        optional={
            "image": st.sampled_from(
                ["vllm/vllm-openai:v0.33.0", "vllm/vllm-openai:v0.27.1", "x", "", "a:b:c"]
            ) | st.text(max_size=200),
            "version": st.sampled_from(["", "0.33.0", "0.99.0", "garbage"]),
            "platform": st.sampled_from(["nvidia", "amd", "tpu"]),
            "maxModelLen": st.integers(-1, 2**31) | JSONISH,
            "gpuMemoryUtilization": st.floats(-1, 2) | JSONISH,
            "kvCacheDtype": st.text(max_size=20),
            "extraArgs": st.lists(
                st.sampled_from(["--port", "8001", "--max-num-seqs", "5", "--x", "; rm -rf /",
                                 "--tensor-parallel-size=2", "$(HOME)"]), max_size=6
            ) | JSONISH,
            "env": st.lists(st.fixed_dictionaries({"name": st.text(max_size=20),
                                                   "value": st.text(max_size=20)}), max_size=3),
        },
    ),
    "parallelism": st.fixed_dictionaries(
        {},
        optional={
            "tensor": st.integers(-1, 130),
            "pipeline": st.integers(-1, 9),
            "decodeContext": st.integers(-1, 9),
            "expert": st.booleans() | JSONISH,
        },
    ),
    "placement": st.fixed_dictionaries(
        {},
        optional={
            "gpusPerNode": st.integers(-1, 17),
            "gpuResource": st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "", "bad resource"]),
            "nodeSelector": st.dictionaries(st.text(max_size=20), st.text(max_size=20),
                                            max_size=2),
            "topologyKey": st.text(max_size=40),
            "tolerations": st.lists(JSONISH, max_size=2),
        },
    ),
    "service": st.fixed_dictionaries({}, optional={"port": st.integers(-1, 70000),
                                                   "type": st.sampled_from(["ClusterIP", "x"])}),
    "rollout": st.fixed_dictionaries({}, optional={"maxSurge": st.integers(-1, 5) | JSONISH,
                                                   "maxUnavailable": st.integers(-1, 5)
                                                   | st.sampled_from(["50%", "x%"])}),
    "preflight": st.fixed_dictionaries({"probe": st.just(False)},
                                       optional={"mode": st.sampled_from(
                                           ["Enforce", "Warn", "Disabled", "x"])}),
    "monitoring": st.fixed_dictionaries({}, optional={"podMonitor": st.booleans(),
                                                      "minAcceptanceRate": st.floats(-1, 2)}),
    "resources": st.fixed_dictionaries({}, optional={"cpu": st.text(max_size=8),
                                                     "memory": st.text(max_size=8),
                                                     "sharedMemory": st.text(max_size=8)}),
}  # fmt: skip
SPECS = st.fixed_dictionaries({}, optional=FIELDS) | st.dictionaries(
    st.text(max_size=10), JSONISH, max_size=4
)


def hostile(cluster: Cluster, api: ApiKube, count: int) -> None:
    ns = create_test_namespace(cluster, "fault-specs")
    operator = OperatorProcess(cluster, ns, label="-specs")
    offset = operator.log.stat().st_size if operator.log.exists() else 0
    operator.start()
    outcome: Counter[str] = Counter()
    accepted: list[str] = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(SPECS)
    def send(spec: dict[str, Any]) -> None:
        name = f"h{sum(outcome.values()):04d}"
        manifest = {
            "apiVersion": API,
            "kind": "KimiK3Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }
        try:
            api.create(manifest)
        except KubeError as exc:
            outcome[f"refused {exc.status}"] += 1
            return
        except (TypeError, ValueError):
            outcome["not JSON"] += 1
            return
        outcome["accepted"] += 1
        accepted.append(name)

    try:
        assert operator.process is not None
        pid = operator.process.pid
        send()
        print(f"{sum(outcome.values())} generated specs through the API server: {dict(outcome)}")
        time.sleep(30)  # the operator works through what the schema let in
        partial = []
        lws_names = {
            x["metadata"]["name"]
            for x in api.list("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", ns)
        }
        services = {
            x["metadata"]["name"]
            for x in api.list("v1", "Service", ns, label_selector="app.kubernetes.io/managed-by"
                              "=kimik3-operator")
        }  # fmt: skip
        for name in accepted:
            if (name in lws_names) != (name in services):
                partial.append(name)
        log = operator.log.read_bytes()[offset:].decode(errors="replace")
        alive = operator.process.poll() is None and operator.process.pid == pid
        verdicts: Counter[str] = Counter()
        for item in api.list(API, "KimiK3Deployment", ns):
            verdicts[item.get("status", {}).get("reason", "no status yet")] += 1
        print(
            f"operator alive, same process: {alive}; tracebacks in its log: "
            f"{log.count('Traceback')}; partial child sets: {len(partial)} {partial[:5]}; "
            f"deployed {len(lws_names)} of {len(accepted)} accepted"
        )
        print(f"status reasons of the accepted: {dict(verdicts.most_common(12))}")
    finally:
        operator.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--outage", type=float, default=30)
    parser.add_argument("--specs", type=int, default=1000)
    parser.add_argument("--only", choices=["outage", "lws", "specs"])
    args = parser.parse_args()
    cluster = Cluster(KUBECONFIG, tools_bin())
    os.environ["KUBECONFIG"] = str(KUBECONFIG)
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests/crd")
    )
    api = ApiKube.from_environment()
    for ns in ("fault-outage", "fault-lws", "fault-specs"):  # what an earlier run left
        cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")
        subprocess.run(
            [str(cluster.bin_dir / "kubectl"), "wait", "--for=delete", f"namespace/{ns}",
             "--timeout=300s"], env=cluster.env, capture_output=True, check=False,
        )  # fmt: skip
    try:
        if args.only in (None, "outage"):
            outage(cluster, api, args.outage)
        if args.only in (None, "lws"):
            lws_stopped(cluster, api)
        if args.only in (None, "specs"):
            hostile(cluster, api, args.specs)
    finally:
        for ns in ("fault-outage", "fault-lws", "fault-specs"):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
