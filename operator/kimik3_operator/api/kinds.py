"""Every kind the operator reads or writes, with its apiVersion and its plural: the one
table the client's paths, the runtime's watches and the reconcile's snapshot all read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from kimik3_operator.api import constants as c


@dataclass(frozen=True)
class Kind:
    kind: str
    api_version: str  # "v1" for the core group
    plural: str

    def path(self, namespace: str | None, name: str = "", api_version: str = "") -> str:
        """The object's (or, without a name, the collection's) path on the API server."""
        version = api_version or self.api_version
        base = f"/apis/{version}" if "/" in version else f"/api/{version}"
        where = f"{base}/namespaces/{quote(namespace)}" if namespace else base
        path = f"{where}/{self.plural}"
        return f"{path}/{quote(name)}" if name else path


KINDS: Final[dict[str, Kind]] = {
    kind.kind: kind
    for kind in (
        Kind(c.KIND, c.API_VERSION, c.PLURAL),
        Kind("LeaderWorkerSet", f"{c.LWS_GROUP}/{c.LWS_VERSION}", c.LWS_PLURAL),
        Kind("DisaggregatedSet", f"{c.DS_GROUP}/{c.DS_VERSION}", c.DS_PLURAL),
        Kind("PodMonitor", f"{c.MONITORING_GROUP}/v1", "podmonitors"),
        Kind("ScaledObject", f"{c.KEDA_GROUP}/{c.KEDA_VERSION}", "scaledobjects"),
        Kind("InferencePool", f"{c.INFERENCE_GROUP}/{c.INFERENCE_VERSION}", "inferencepools"),
        Kind("HTTPRoute", f"{c.GATEWAY_GROUP}/v1", "httproutes"),
        Kind("Deployment", "apps/v1", "deployments"),
        Kind("ServiceAccount", "v1", "serviceaccounts"),
        Kind("RoleBinding", "rbac.authorization.k8s.io/v1", "rolebindings"),
        Kind("Service", "v1", "services"),
        Kind("Pod", "v1", "pods"),
        Kind("Node", "v1", "nodes"),
        Kind("Namespace", "v1", "namespaces"),
        Kind("Event", "v1", "events"),
        Kind("ConfigMap", "v1", "configmaps"),
        Kind("PersistentVolumeClaim", "v1", "persistentvolumeclaims"),
        Kind("Job", "batch/v1", "jobs"),
        Kind("CustomResourceDefinition", "apiextensions.k8s.io/v1", "customresourcedefinitions"),
        Kind("Lease", "coordination.k8s.io/v1", "leases"),
        Kind("Workload", f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}", "workloads"),
        Kind("LocalQueue", f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}", "localqueues"),
        Kind("ClusterQueue", f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}", "clusterqueues"),
    )
}
# A KimiK3Deployment's children, each watched with the managed-by label selector.
CHILDREN: Final[tuple[Kind, ...]] = tuple(
    KINDS[name]
    for name in (
        "LeaderWorkerSet",
        "DisaggregatedSet",
        "Service",
        "PodMonitor",
        "ScaledObject",
        "ServiceAccount",
        "RoleBinding",
        "Deployment",
        "InferencePool",
        "HTTPRoute",
        "Job",
        "ConfigMap",
        "Pod",
    )
)
