"""Shared fixtures: small fluent spec builders and a recording fake of the Kube client."""

from __future__ import annotations

import builtins
import copy
import json
import pathlib
import threading
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.kube import KubeError, Obj

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "manifests" / "crd" / "kimik3deployments.yaml"


def spec_of(**sections: Mapping[str, Any] | int) -> KimiK3DeploymentSpec:
    """parse_spec of a spec given as keyword sections: spec_of(parallelism={"tensor": 8})."""
    return parse_spec(dict(sections))


FIXTURES = ROOT / "operator" / "tests" / "fixtures"


def probe_report(platform: str = "nvidia") -> dict[str, Any]:
    """What the real probe printed for vllm 0.33.0 (the vllm tier checks it has not drifted)."""
    loaded: dict[str, Any] = json.loads(
        (FIXTURES / f"probe-report-vllm-0.33.0-{platform}.json").read_text()
    )
    return loaded


def resource(
    name: str = "k3", namespace: str = "llm", generation: int = 1, **spec: Any
) -> dict[str, Any]:
    """A stored KimiK3Deployment; the image probe is off unless the spec turns it on."""
    spec.setdefault("preflight", {"probe": False})
    return {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "uid-1",
            "generation": generation,
        },
        "spec": spec,
    }


@pytest.fixture
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


class FakeKube:
    """Stands in for the API server in unit tests: stores objects, counts writes.

    Apply merges like a server-side apply of the full object; the end-to-end tests use the
    real API server.
    """

    def __init__(
        self,
        crds: tuple[str, ...] = (
            "leaderworkersets.leaderworkerset.x-k8s.io",
            "podmonitors.monitoring.coreos.com",
        ),
    ) -> None:
        self.objects: dict[tuple[str, str, str | None, str], Obj] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.forced: list[bool] = []
        self.uids = 100
        self.versions = 1000
        self._lock = threading.Lock()
        for name in crds:
            self.objects[("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, name)] = {
                "metadata": {"name": name}
            }

    def _bump(self, obj: Obj) -> None:
        """Like etcd: every write gives the object a new resourceVersion."""
        self.versions += 1
        obj["metadata"]["resourceVersion"] = str(self.versions)

    def put(self, obj: Obj) -> None:
        meta = obj["metadata"]
        meta.setdefault("resourceVersion", str(self.versions))
        self.objects[(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])] = obj

    def put_job_pod(self, pod: Obj) -> None:
        """A pod as the Job controller makes it: controlled by the Job whose key label
        (probe-key, cache-key or collect-key) it carries, with the labels of the Job's pod
        template."""
        labels = pod["metadata"].get("labels") or {}
        for (_, kind, namespace, _), job in self.objects.items():
            job_labels = job["metadata"].get("labels") or {}
            if (
                kind == "Job"
                and namespace == pod["metadata"].get("namespace")
                and any(
                    key.endswith(("probe-key", "cache-key", "collect-key"))
                    and job_labels.get(key) == value
                    for key, value in labels.items()
                )
            ):
                template = job.get("spec", {}).get("template", {}).get("metadata", {})
                pod["metadata"]["labels"] = {**(template.get("labels") or {}), **labels}
                pod["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job["metadata"]["name"],
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ]
        self.put(pod)

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        found = self.objects.get((api_version, kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]:
        wanted = dict(p.split("=", 1) for p in label_selector.split(",") if p)
        out = []
        for (av, k, ns, _), obj in self.objects.items():
            labels = obj.get("metadata", {}).get("labels", {}) or {}
            if (
                (av, k) == (api_version, kind)
                and (namespace is None or ns == namespace)
                and all(labels.get(key) == value for key, value in wanted.items())
            ):
                out.append(copy.deepcopy(obj))
        return out

    def get_from_server(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        return self.get(api_version, kind, name, namespace)

    def list_from_server(
        self, api_version: str, kind: str, namespace: str, label_selector: str, limit: int
    ) -> builtins.list[Obj]:
        return self.list(api_version, kind, namespace, label_selector)[:limit]

    def apply(self, manifest: Mapping[str, Any], force: bool = True) -> Obj:
        # The reconcile applies independent children from several threads at once.
        with self._lock:
            return self._apply(manifest, force)

    def _apply(self, manifest: Mapping[str, Any], force: bool) -> Obj:
        self.writes.append(("apply", manifest["kind"], manifest["metadata"]["name"]))
        self.forced.append(force)
        obj = copy.deepcopy(dict(manifest))
        meta = obj["metadata"]
        live = self.objects.get(
            (obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        )
        # Like the API server: a new object gets a uid, an existing one keeps its own.
        self.uids += live is None
        uid = ((live or {}).get("metadata") or {}).get("uid") or f"uid-{self.uids}"
        meta.setdefault("uid", uid)
        self._bump(obj)
        self.put(obj)
        return obj

    def patch_status(
        self, api_version: str, kind: str, name: str, namespace: str, status: Mapping[str, Any]
    ) -> Obj:
        self.writes.append(("patch_status", kind, name))
        obj = self.objects[(api_version, kind, namespace, name)]
        obj["status"] = merge_patch(obj.get("status") or {}, copy.deepcopy(dict(status)))
        self._bump(obj)
        return obj

    def patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: Mapping[str, Any]
    ) -> Obj:
        self.writes.append(("patch", kind, name))
        obj = self.objects[(api_version, kind, namespace, name)]
        # A resourceVersion in the patch is a precondition, as the API server holds it.
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"].get("resourceVersion"):
            raise KubeError(409, "Conflict", f"{kind}/{name}: the object has been modified")
        for key, value in copy.deepcopy(dict(patch)).get("metadata", {}).items():
            held = obj["metadata"].get(key)
            if isinstance(value, dict) and isinstance(held, dict):
                held.update(value)  # a merge patch merges maps (labels, annotations)
            else:
                obj["metadata"][key] = value
        self._bump(obj)
        return copy.deepcopy(obj)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        self.writes.append(("delete", kind, name))
        self.objects.pop((api_version, kind, namespace, name), None)

    def create(self, manifest: Mapping[str, Any]) -> Obj:
        self.writes.append(("create", manifest["kind"], manifest["metadata"].get("name", "")))
        return dict(manifest)


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch: objects merge key by key, null
    removes a key, anything else (lists included) replaces."""
    if not isinstance(patch, Mapping):
        return patch
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def key_of(body: Mapping[str, Any] | None) -> tuple[str, str]:
    """The queue's key of a stored resource: what a reconcile is given."""
    assert body is not None
    return body["metadata"]["namespace"], body["metadata"]["name"]


def settle(kube: FakeKube, key: tuple[str, str], context: Any = None, passes: int = 4) -> Any:
    """Reconciles until a pass writes nothing (what the watches' events would do after each
    write), and returns the first pass's result. A pass observes what the one before it
    wrote; one that never stops writing fails."""
    from kimik3_operator.controller.reconcile import reconcile

    first = reconcile(kube, key, context)
    for _ in range(passes):
        before = len(kube.writes)
        reconcile(kube, key, context)
        if len(kube.writes) == before:
            return first
    raise AssertionError(f"still writing after {passes + 1} reconciles: {kube.writes[-5:]}")
