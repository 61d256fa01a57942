"""The spec's sections, the values its fields take, and the error that names a bad one.

Every field's JSON name is its camelCase form unless a field says otherwise through
``metadata={"json": ...}``; defaults here are the same as the CRD schema's (a unit test
walks both and fails on any disagreement).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

KimiArchitecture = Literal[
    "KimiLinearForCausalLM",
    "KimiK3ForConditionalGeneration",
    "KimiK31ForConditionalGeneration",
]
DrafterMethod = Literal["dspark", "eagle3", "dflash", "mtp", "draft_model", "ngram", "none"]
Platform = Literal["nvidia", "amd"]
# Linux capabilities a serving pod may add back: memlock for RDMA fabrics, NUMA binding.
Capability = Literal["IPC_LOCK", "SYS_NICE"]
PreflightMode = Literal["Enforce", "Warn", "Disabled"]
ServiceType = Literal["ClusterIP", "NodePort", "LoadBalancer"]
SampleMethod = Literal["greedy", "probabilistic"]
RejectionSampleMethod = Literal["standard", "synthetic", "block"]
CacheAccessMode = Literal["ReadWriteMany", "ReadOnlyMany"]
CanaryOnFailure = Literal["Rollback", "Hold"]

# The Kimi classes the capability table judges; spec.model.architecture takes any class name,
# and the image probe judges the others.
TARGET_ARCHITECTURES: tuple[str, ...] = get_args(KimiArchitecture)
# A class of the other attention type (GQA) the table judges too, once its config.json is
# given (spec.model.config): vLLM checks parallelism against KV heads only where there is no
# MLA. Without its config.json it is the probe's, like any other class.
GQA_ARCHITECTURES: tuple[str, ...] = ("LlamaForCausalLM",)
TEXT_ONLY_ARCHITECTURE = "KimiLinearForCausalLM"
MULTIMODAL_ARCHITECTURES: tuple[str, ...] = (
    "KimiK3ForConditionalGeneration",
    "KimiK31ForConditionalGeneration",
)
EAGLE3_FAMILY: tuple[DrafterMethod, ...] = ("dspark", "eagle3", "dflash")
# Methods that load a drafter checkpoint of their own (repo or source); mtp drafts from the
# target's own layers, ngram from the prompt.
CHECKPOINT_METHODS: tuple[DrafterMethod, ...] = (*EAGLE3_FAMILY, "draft_model")


# The CRD's pattern (RE2 has no look-ahead): hours, minutes, seconds, in that order.
DURATION = re.compile(r"^([0-9]+h([0-9]+m)?([0-9]+s)?|[0-9]+m([0-9]+s)?|[0-9]+s)$")
_PART = re.compile(r"([0-9]+)([hms])")
_UNIT = {"h": 3600, "m": 60, "s": 1}


def duration_seconds(text: str) -> float:
    """Seconds in a duration written as 90s, 15m or 1h30m (0 when it does not parse)."""
    if DURATION.match(text) is None:
        return 0.0
    return float(sum(int(amount) * _UNIT[unit] for amount, unit in _PART.findall(text)))


class SpecError(ValueError):
    """A spec that cannot be served: names the field, the value and the fix."""

    def __init__(self, path: str, value: Any, problem: str, fix: str = "") -> None:
        self.path = path
        self.value = value
        self.problem = problem
        self.fix = fix
        text = f"{path}={value!r}: {problem}"
        if fix:
            text += f"; {fix}"
        super().__init__(text)


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = "token"


@dataclass(frozen=True)
class HuggingFaceSource:
    pass


@dataclass(frozen=True)
class PVCSource:
    claim_name: str
    path: str = ""


@dataclass(frozen=True)
class ModelSource:
    hugging_face: HuggingFaceSource | None = None
    pvc: PVCSource | None = None


@dataclass(frozen=True)
class ModelCacheSpec:
    """One volume that holds the weights for every pod: filled once by a download Job
    (ReadWriteMany) or, pre-filled by the user, only verified (ReadOnlyMany)."""

    claim_name: str = ""  # empty: the operator creates <name>-model-cache
    size: str = "2Ti"
    storage_class_name: str = ""
    access_mode: CacheAccessMode = "ReadWriteMany"
    # The download: connections at once (across files and within a large one), chunk size.
    connections: int = 32
    chunk_size: str = "16Mi"


@dataclass(frozen=True)
class ModelSpec:
    repo: str = "moonshotai/Kimi-K3"
    revision: str = "main"
    architecture: str = TEXT_ONLY_ARCHITECTURE
    served_name: str = ""
    # The checkpoint's config.json as text: facts for the static stage before the probe.
    config: str = ""
    source: ModelSource = field(default_factory=lambda: ModelSource(HuggingFaceSource()))
    hf_token_secret_ref: SecretKeyRef | None = None
    cache: ModelCacheSpec | None = None

    @property
    def multimodal(self) -> bool:
        return self.architecture in MULTIMODAL_ARCHITECTURES


@dataclass(frozen=True)
class DrafterSource:
    pvc: PVCSource


@dataclass(frozen=True)
class DrafterSpec:
    method: DrafterMethod = "dspark"
    repo: str = ""
    source: DrafterSource | None = None
    revision: str = "main"
    config: str = ""
    num_speculative_tokens: int | None = None
    draft_tensor_parallel_size: int | None = None
    draft_sample_method: SampleMethod | None = None
    rejection_sample_method: RejectionSampleMethod | None = None


@dataclass(frozen=True)
class EngineSpec:
    image: str = "vllm/vllm-openai:v0.33.0"
    version: str = ""
    platform: Platform = "nvidia"
    max_model_len: int = 32768
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "fp8"
    extra_args: tuple[str, ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    add_capabilities: tuple[Capability, ...] = ()


@dataclass(frozen=True)
class ParallelismSpec:
    tensor: int = 16
    pipeline: int = 1
    decode_context: int = 1
    expert: bool = False
    # vLLM's data-parallel engines in one group (--data-parallel-size), each tensor x
    # pipeline GPUs: the decode side of Kimi-K3's P/D recipe.
    data: int = 1


@dataclass(frozen=True)
class JobPlacementSpec:
    """Where the CPU-only Jobs (the image probe, the weight download) run."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class PlacementSpec:
    gpus_per_node: int = 8
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    topology_key: str = ""
    scheduler_name: str = ""
    priority_class_name: str = ""
    jobs: JobPlacementSpec = field(default_factory=JobPlacementSpec)


@dataclass(frozen=True)
class TopologySpec:
    """The node label a whole group must (``required``) or should (``preferred``) share."""

    required: str | None = None
    preferred: str | None = None


@dataclass(frozen=True)
class SchedulingSpec:
    """Admission through Kueue: each group one Workload, admitted whole or not at all."""

    queue_name: str | None = None
    workload_priority_class_name: str | None = None
    topology: TopologySpec | None = None


@dataclass(frozen=True)
class AutoscalingTarget:
    """What one group is sized for: vLLM's waiting requests per group, and (when set) its
    KV-cache usage per group as a second trigger."""

    waiting_requests_per_group: int = 8
    kv_cache_usage: float | None = None


@dataclass(frozen=True)
class AutoscalingBehavior:
    """How quickly KEDA's HPA follows the load; None: derived from the start-up budget."""

    scale_up_stabilization_seconds: int = 0
    scale_down_stabilization_seconds: int | None = None
    polling_interval_seconds: int = 15


@dataclass(frozen=True)
class AutoscalingSpec:
    """The groups driven by KEDA on the leaders' own load, between min and max."""

    max_replicas: int
    min_replicas: int = 1
    # minReplicas 0 is taken only with this and a model cache: the first request after a
    # scale to zero waits a whole start-up.
    scale_to_zero: bool = False
    target: AutoscalingTarget = field(default_factory=AutoscalingTarget)
    behavior: AutoscalingBehavior = field(default_factory=AutoscalingBehavior)


@dataclass(frozen=True)
class GatewayRef:
    """The Gateway an HTTPRoute attaches this deployment's InferencePool to."""

    name: str
    # Empty: the deployment's namespace (the Gateway's allowedRoutes decide whether it takes
    # a route from here).
    namespace: str = ""
    section_name: str = ""


FailureMode = Literal["FailClose", "FailOpen"]


@dataclass(frozen=True)
class RoutingSpec:
    """Requests routed by the Gateway API Inference Extension: an InferencePool of the
    routable leaders and an endpoint picker (EPP) that picks by queue and KV-cache use; a
    group whose drafter fails, or that a canary judges, leaves the pool."""

    # What the gateway does when the picker does not answer (the InferencePool's field).
    failure_mode: FailureMode = "FailClose"
    # A group leaves routing while its acceptance is this fraction below the median group's.
    max_acceptance_drop: float = 0.5
    gateway: GatewayRef | None = None


@dataclass(frozen=True)
class ResourcesSpec:
    cpu: str = ""  # a request only: vLLM's host threads burst
    cpu_limit: str = ""
    memory: str = ""
    shared_memory: str = "64Gi"


# The user the serving pods run as when non-root and none is named (vLLM's images name none).
DEFAULT_USER = 1000


KvConnector = Literal["Nixl"]
DisaggregatedRole = Literal["prefill", "decode"]
DISAGGREGATED_ROLES: tuple[DisaggregatedRole, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class RoleSpec:
    """One side of a prefill/decode pair: its groups, and what it changes of the
    deployment's parallelism, resources and engine arguments (None: the deployment's)."""

    replicas: int = 1
    parallelism: ParallelismSpec | None = None
    resources: ResourcesSpec | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class DisaggregationSpec:
    """Prefill and decode in separate groups, the KV cache carried from one to the other
    by a vLLM KV connector: one DisaggregatedSet of two roles."""

    prefill: RoleSpec = field(default_factory=RoleSpec)
    decode: RoleSpec = field(default_factory=RoleSpec)
    connector: KvConnector = "Nixl"
    # The decode groups' acceptance this fraction under the deployment's baseline is a
    # transfer that lost the drafter's state.
    max_acceptance_drop: float = 0.2

    def role(self, name: DisaggregatedRole) -> RoleSpec:
        return self.prefill if name == "prefill" else self.decode


@dataclass(frozen=True)
class SecuritySpec:
    """Who the serving pods run as. A non-root process loses every added capability when it
    starts vLLM (Kubernetes sets no ambient capabilities), so runAsNonRoot defaults to true
    only where engine.addCapabilities is empty."""

    run_as_non_root: bool | None = None
    run_as_user: int | None = None
    run_as_group: int | None = None
    fs_group: int | None = None
    read_only_root_filesystem: bool = True


@dataclass(frozen=True)
class ServiceSpec:
    port: int = 8000
    type: ServiceType = "ClusterIP"
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServingPodSpec:
    """What a platform adds to the serving pods, leader and workers alike: nothing here
    changes what the preflight judged (the builders put the operator's own labels, env,
    image and command over it)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    runtime_class_name: str = ""
    # Checked against the operator's allowed list (KIMIK3_SERVICE_ACCOUNTS) before any child.
    service_account_name: str = ""
    image_pull_secrets: tuple[Mapping[str, Any], ...] = ()
    # Extended resources per pod besides the GPUs (an RDMA fabric), requests = limits.
    extra_resources: Mapping[str, Any] = field(default_factory=dict)
    env_from: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    topology_spread_constraints: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class CanarySpec:
    """A change of the groups' pods goes to ``groups`` groups first; they are observed for
    ``window`` and promoted, or rolled back (or held) when they fall short."""

    groups: int = 1
    window: str = "15m"
    # None: spec.monitoring.minAcceptanceRate.
    min_acceptance_rate: float | None = None
    # The canary's acceptance may be at most this fraction below the stable groups'.
    max_acceptance_drop: float = 0.1
    # From the change until every canary group is Ready; longer is a failure.
    ready_timeout: str = "30m"
    on_failure: CanaryOnFailure = "Rollback"

    @property
    def window_seconds(self) -> float:
        return duration_seconds(self.window)

    @property
    def ready_timeout_seconds(self) -> float:
        return duration_seconds(self.ready_timeout)


@dataclass(frozen=True)
class RolloutSpec:
    max_surge: int | str = 0
    max_unavailable: int | str = 1
    # Start-up failures one generation may have before the deployment is parked.
    max_startup_failures: int = 3
    # None: no canary, LeaderWorkerSet's rolling update alone.
    canary: CanarySpec | None = None


@dataclass(frozen=True)
class PreflightSpec:
    mode: PreflightMode = "Enforce"
    probe: bool = True


@dataclass(frozen=True)
class MonitoringSpec:
    pod_monitor: bool = True
    min_acceptance_rate: float = 0.5


def json_name(f: dataclasses.Field[Any]) -> str:
    """The camelCase key of a dataclass field in the resource."""
    explicit = f.metadata.get("json")
    if explicit:
        return str(explicit)
    head, *rest = f.name.split("_")
    return head + "".join(part.capitalize() for part in rest)
