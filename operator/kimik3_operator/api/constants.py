"""Group, labels, annotations, condition types and reasons: the stable vocabulary of the API."""

from __future__ import annotations

from enum import StrEnum, unique
from typing import Final

GROUP: Final = "serving.kimik3.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "KimiK3Deployment"
PLURAL: Final = "kimik3deployments"

FIELD_MANAGER: Final = "kimik3-operator"
SPEC_HASH_ANNOTATION: Final = f"{GROUP}/spec-hash"
PROBE_KEY_LABEL: Final = f"{GROUP}/probe-key"
CACHE_KEY_LABEL: Final = f"{GROUP}/cache-key"
COLLECT_KEY_LABEL: Final = f"{GROUP}/collect-key"
# On the probe Job: the report its pod gave, kept once read (the pod may be collected).
PROBE_REPORT_ANNOTATION: Final = f"{GROUP}/probe-report"
# On a KimiK3Deployment: a new value un-parks it and gives it a fresh start-up failure budget.
RETRY_ANNOTATION: Final = f"{GROUP}/retry"
# On the serving pods: a hash of the pod template they were made from (the canary's and the
# stable groups' pods tell apart by it).
TEMPLATE_HASH_LABEL: Final = f"{GROUP}/template-hash"
# On the LeaderWorkerSet: the spec whose pods the stable groups run, restored on a rollback.
STABLE_SPEC_ANNOTATION: Final = f"{GROUP}/stable-spec"
OPERATOR_NAME: Final = "kimik3-operator"
# The operator keeps a resource's spec up to this size (the schema bounds it near 100 KiB);
# a larger one, stored before those bounds, is kept as this key with its size, and refused.
MAX_SPEC_BYTES: Final = 256 * 1024
OVERSIZED_SPEC_KEY: Final = "\x00kimik3: oversized spec"
# Releases before 0.2 ran kopf timers, which made kopf put this finalizer on every resource.
LEGACY_KOPF_FINALIZER: Final = "kopf.zalando.org/KopfFinalizerMarker"

LWS_GROUP: Final = "leaderworkerset.x-k8s.io"
LWS_VERSION: Final = "v1"
LWS_PLURAL: Final = "leaderworkersets"
LWS_CRD: Final = f"{LWS_PLURAL}.{LWS_GROUP}"
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_EXCLUSIVE_TOPOLOGY: Final = "leaderworkerset.sigs.k8s.io/exclusive-topology"

# Kueue (v0.17): the keys its LeaderWorkerSet integration reads.
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
KUEUE_WORKLOAD_CRD: Final = f"workloads.{KUEUE_GROUP}"
KUEUE_QUEUE_LABEL: Final = f"{KUEUE_GROUP}/queue-name"
KUEUE_PRIORITY_CLASS_LABEL: Final = f"{KUEUE_GROUP}/priority-class"
# On the LeaderWorkerSet, at its creation only: Kueue admits none of its Workloads until the
# named controllers are gone from it (alpha feature gate AdmissionGatedBy).
KUEUE_ADMISSION_GATED_BY: Final = f"{KUEUE_GROUP}/admission-gated-by"
KUEUE_PREFLIGHT_GATE: Final = f"{GROUP}/preflight"
KUEUE_REQUIRED_TOPOLOGY: Final = f"{KUEUE_GROUP}/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY: Final = f"{KUEUE_GROUP}/podset-preferred-topology"
# The same value on the leader's and the workers' templates: one group, one domain.
KUEUE_PODSET_GROUP: Final = f"{KUEUE_GROUP}/podset-group-name"
# On a Workload: the uid of the LeaderWorkerSet it admits a group of.
KUEUE_JOB_UID_LABEL: Final = f"{KUEUE_GROUP}/job-uid"
# The scheduling gate Kueue puts on a pod until its Workload is admitted.
KUEUE_SCHEDULING_GATE: Final = f"{KUEUE_GROUP}/admission"

# KEDA: spec.autoscaling renders one ScaledObject whose target is the KimiK3Deployment.
KEDA_GROUP: Final = "keda.sh"
KEDA_VERSION: Final = "v1alpha1"
KEDA_SCALEDOBJECT_CRD: Final = f"scaledobjects.{KEDA_GROUP}"
# KEDA turns these into the HPA's selectPolicy Disabled for that direction.
KEDA_PAUSED_SCALE_OUT: Final = "autoscaling.keda.sh/paused-scale-out"
KEDA_PAUSED_SCALE_IN: Final = "autoscaling.keda.sh/paused-scale-in"
# Where KEDA asks Prometheus unless the operator's settings say otherwise:
# kube-prometheus-stack's Service in the monitoring namespace.
DEFAULT_PROMETHEUS_URL: Final = "http://prometheus-operated.monitoring.svc:9090"

# The Gateway API Inference Extension: spec.routing makes an InferencePool and its endpoint
# picker (EPP), and, when a Gateway is named, an HTTPRoute.
INFERENCE_GROUP: Final = "inference.networking.k8s.io"
INFERENCE_VERSION: Final = "v1"
INFERENCEPOOL_CRD: Final = f"inferencepools.{INFERENCE_GROUP}"
GATEWAY_GROUP: Final = "gateway.networking.k8s.io"
HTTPROUTE_CRD: Final = f"httproutes.{GATEWAY_GROUP}"
DEFAULT_EPP_IMAGE: Final = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
DEFAULT_EPP_CLUSTER_ROLE: Final = "kimik3-operator-endpoint-picker"
# On a leader pod: the operator's word that its group takes requests (the pool selects it).
LABEL_ROUTABLE: Final = f"{GROUP}/routable"

# LeaderWorkerSet's DisaggregatedSet (v0.9.0 on): spec.disaggregation makes one, whose
# controller makes a LeaderWorkerSet per role, <set>-<revision>-<role>.
DS_GROUP: Final = "disaggregatedset.x-k8s.io"
DS_VERSION: Final = "v1"
DS_PLURAL: Final = "disaggregatedsets"
DS_CRD: Final = f"{DS_PLURAL}.{DS_GROUP}"
DS_NAME_LABEL: Final = f"{DS_GROUP}/name"
DS_ROLE_LABEL: Final = f"{DS_GROUP}/role"
# On a serving pod of a disaggregated deployment: prefill or decode (and llm-d's key, which
# its P/D router selects by).
LABEL_ROLE: Final = f"{GROUP}/role"
LLM_D_ROLE_LABEL: Final = "llm-d.ai/role"
# vLLM's NIXL side channel: the port the decode side's handshake asks the prefill side on.
NIXL_SIDE_CHANNEL_PORT: Final = 5600
# spec.disaggregation.connector -> vLLM's connector class.
KV_CONNECTOR_CLASSES: Final = {"Nixl": "NixlConnector"}
# spec.disaggregation.connector -> the name llm-d's routing sidecar gives its protocol.
SIDECAR_KV_CONNECTORS: Final = {"Nixl": "nixlv2"}
# llm-d's P/D routing sidecar, in front of each decode leader: a request the P/D router
# names a prefill leader for (header x-prefiller-host-port) is prefilled there first, and the
# decode engine pulls its KV cache. It listens on the deployment's service port; the decode
# engine moves to DECODE_ENGINE_PORT (the next port when the service port is that one).
DEFAULT_ROUTING_SIDECAR_IMAGE: Final = "ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.10.0"
DECODE_ENGINE_PORT: Final = 8200
SIDECAR_PORT_NAME: Final = "proxy"
# llm-d's router (endpoint picker) with the P/D plugins, which spec.routing runs for a
# disaggregated deployment: the Inference Extension's own picker has no P/D profiles.
DEFAULT_PD_PICKER_IMAGE: Final = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"

MONITORING_GROUP: Final = "monitoring.coreos.com"
PODMONITOR_CRD: Final = f"podmonitors.{MONITORING_GROUP}"

LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
APP_NAME: Final = "kimi-k3"

COMPONENT_LEADER: Final = "leader"
COMPONENT_WORKER: Final = "worker"
COMPONENT_PREFLIGHT: Final = "preflight"
COMPONENT_SERVING: Final = "serving"
COMPONENT_DOWNLOAD: Final = "download"
COMPONENT_COLLECT: Final = "collect"
COMPONENT_MODEL_CACHE: Final = "model-cache"
COMPONENT_EPP: Final = "endpoint-picker"


@unique
class ConditionType(StrEnum):
    CAPABILITIES_VERIFIED = "CapabilitiesVerified"
    DRAFTER_PAIRED = "DrafterPaired"
    PROGRESSING = "Progressing"
    AVAILABLE = "Available"
    DEGRADED = "Degraded"
    SPECULATION_EFFECTIVE = "SpeculationEffective"
    MODEL_CACHED = "ModelCached"
    CANARY_VERIFIED = "CanaryVerified"
    # Whether a group that spans nodes asks for a fabric between them (a warning, not a gate).
    INTER_NODE_FABRIC = "InterNodeFabric"
    # With spec.scheduling.queueName: whether Kueue admitted every group.
    ADMITTED = "Admitted"
    # With spec.autoscaling: whether KEDA drives the groups freely, or what holds or limits it.
    AUTOSCALING = "Autoscaling"
    # With spec.routing: whether the endpoint picker routes to every Ready group, or what
    # keeps a group out or the picker from routing.
    ROUTING = "Routing"
    # With spec.disaggregation: whether both roles' groups are ready (the message says each
    # role's count and what holds it).
    DISAGGREGATED = "Disaggregated"
    # With spec.disaggregation and a drafter: whether the decode groups accept drafts as the
    # prefill groups do (a transfer that loses the drafter's state shows here first).
    TRANSFER_INTEGRITY = "TransferIntegrity"


@unique
class Reason(StrEnum):
    """Condition reasons. They are an API: alerts and scripts match on them."""

    # Progressing / Available
    WAITING_FOR_LEADER_WORKER_SET = "WaitingForLeaderWorkerSet"
    GROUPS_STARTING = "GroupsStarting"
    ROLLING_UPDATE = "RollingUpdate"
    AVAILABLE = "Available"
    NO_GROUP_READY = "NoGroupReady"
    SOME_GROUPS_READY = "SomeGroupsReady"
    SCALED_TO_ZERO = "ScaledToZero"
    # Degraded
    AS_EXPECTED = "AsExpected"
    INVALID_SPEC = "InvalidSpec"
    LEADER_WORKER_SET_CRD_MISSING = "LeaderWorkerSetCRDMissing"
    POD_CRASH_LOOPING = "PodCrashLooping"
    POD_OOM_KILLED = "PodOOMKilled"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    INSUFFICIENT_GPUS = "InsufficientGPUs"
    NODE_LOST = "NodeLost"
    UNSCHEDULABLE = "Unschedulable"
    APPLY_FAILED = "ApplyFailed"
    NAME_CONFLICT = "NameConflict"
    # The namespace's enforced Pod Security level would refuse a pod the spec makes
    POD_SECURITY_REFUSED = "PodSecurityRefused"
    POD_SECURITY_ADMITTED = "PodSecurityAdmitted"
    # spec.pod.serviceAccountName is not among those the operator's settings allow
    SERVICE_ACCOUNT_NOT_ALLOWED = "ServiceAccountNotAllowed"
    RECONCILE_FAILED = "ReconcileFailed"
    # An object nested deeper than the operator decodes: skipped, so others are not stopped
    OBJECT_TOO_DEEP = "ObjectTooDeep"
    STATUS_FIELD_IGNORED = "StatusFieldIgnored"
    # A serving container that exited while starting, classified from its last lines
    STARTUP_EAGLE3_UNSUPPORTED = "StartupEagle3Unsupported"
    STARTUP_SPECULATIVE_UNSUPPORTED = "StartupSpeculativeUnsupported"
    STARTUP_OUT_OF_MEMORY = "StartupOutOfMemory"
    STARTUP_RENDEZVOUS_TIMEOUT = "StartupRendezvousTimeout"
    STARTUP_MODEL_LOAD_FAILED = "StartupModelLoadFailed"
    STARTUP_FAILED = "StartupFailed"
    # The start-up failure budget spent: the LeaderWorkerSet is scaled to zero
    PARKED_AFTER_STARTUP_FAILURES = "ParkedAfterStartupFailures"
    PREFLIGHT_FAILED = "PreflightFailed"
    WAITING_FOR_PREFLIGHT = "WaitingForPreflight"
    # Admitted (Kueue): every group admitted; reserved and waiting for admission checks; the
    # queue's answer while a group waits; held by the operator until the preflight passes;
    # a running group evicted or preempted; Kueue absent while a queue is named
    ADMITTED = "Admitted"
    QUOTA_RESERVED = "QuotaReserved"
    WAITING_FOR_QUOTA = "WaitingForQuota"
    ADMISSION_HELD_FOR_PREFLIGHT = "AdmissionHeldForPreflight"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    KUEUE_NOT_INSTALLED = "KueueNotInstalled"
    # Autoscaling: KEDA drives the groups; KEDA absent; held (no scale-out, or no change at
    # all) while the drafter's acceptance collapsed, the deployment is parked, a canary is
    # judged, the preflight has not passed or a group is still starting; the groups asked
    # for clamped to what the free GPUs (or the Kueue quota) can place
    AUTOSCALING_ACTIVE = "AutoscalingActive"
    KEDA_NOT_INSTALLED = "KedaNotInstalled"
    HELD_FOR_ACCEPTANCE = "HeldForAcceptance"
    HELD_WHILE_PARKED = "HeldWhileParked"
    HELD_FOR_CANARY = "HeldForCanary"
    HELD_FOR_PREFLIGHT = "HeldForPreflight"
    HELD_WHILE_STARTING = "HeldWhileStarting"
    CLAMPED_BY_GPUS = "ClampedByGPUs"
    CLAMPED_BY_QUOTA = "ClampedByQuota"
    # Routing: every Ready group routable; some kept out (acceptance, canary, starting); the
    # InferencePool CRD absent; the picker not Ready; a gateway refused the pool; and, as
    # events, a group leaving and rejoining the pool
    ROUTING_ACTIVE = "RoutingActive"
    GROUPS_OUT_OF_ROUTING = "GroupsOutOfRouting"
    INFERENCE_POOL_NOT_INSTALLED = "InferencePoolNotInstalled"
    ENDPOINT_PICKER_NOT_READY = "EndpointPickerNotReady"
    POOL_NOT_ACCEPTED = "PoolNotAccepted"
    GROUP_LEFT_ROUTING = "GroupLeftRouting"
    GROUP_REJOINED_ROUTING = "GroupRejoinedRouting"
    # Disaggregated: both roles ready; a role starting or short of groups; the
    # DisaggregatedSet CRD absent. TransferIntegrity: decode accepts as prefill does; decode
    # accepts far less (the drafter's state is lost in the transfer); too few drafts yet
    ROLES_READY = "RolesReady"
    ROLE_NOT_READY = "RoleNotReady"
    DISAGGREGATED_SET_NOT_INSTALLED = "DisaggregatedSetNotInstalled"
    TRANSFER_INTACT = "TransferIntact"
    DRAFTER_STATE_NOT_TRANSFERRED = "DrafterStateNotTransferred"
    AWAITING_DRAFTS = "AwaitingDrafts"
    # Preflight of a prefill/decode pair: the two roles cannot hand over the KV cache
    # (connector absent, compatibility hash, tensor-parallel direction, pipeline), or can
    KV_TRANSFER_INCOMPATIBLE = "KVTransferIncompatible"
    KV_TRANSFER_COMPATIBLE = "KVTransferCompatible"
    KV_TRANSFER_NEEDS_PROBE = "KVTransferNeedsProbe"
    # Preflight (CapabilitiesVerified, DrafterPaired) and the image probe
    ARCHITECTURE_NOT_REGISTERED = "ArchitectureNotRegistered"
    ARCHITECTURE_REGISTERED = "ArchitectureRegistered"
    ARCHITECTURE_NEEDS_PROBE = "ArchitectureNeedsProbe"
    DRAFTER_NEEDS_PROBE = "DrafterNeedsProbe"
    AUTO_PAIRED = "AutoPaired"
    DSPARK_REFUSES_DECODE_CONTEXT_PARALLEL = "DSparkRefusesDecodeContextParallel"
    DSPARK_REFUSES_PIPELINE_PARALLEL = "DSparkRefusesPipelineParallel"
    DECODE_CONTEXT_PARALLEL_SUPPORTED = "DecodeContextParallelSupported"
    DECODE_CONTEXT_EXCEEDS_KV_HEADS = "DecodeContextExceedsKVHeads"
    EXPERT_PARALLEL_WITHOUT_EXPERTS = "ExpertParallelWithoutExperts"
    DRAFT_TENSOR_PARALLEL_SIZE_INVALID = "DraftTensorParallelSizeInvalid"
    DRAFTER_ARCHITECTURE_MISMATCH = "DrafterArchitectureMismatch"
    DRAFTER_NOT_FOUND = "DrafterNotFound"
    DRAFTER_NOT_IMPLEMENTED_ON_PLATFORM = "DrafterNotImplementedOnPlatform"
    DRAFTER_TARGET_LAYERS_INVALID = "DrafterTargetLayersInvalid"
    DRAFTER_VOCABULARY_MISMATCH = "DrafterVocabularyMismatch"
    DRAFTER_CONFIG_REFUSED = "DrafterConfigRefused"
    DRAFTER_LACKS_PARALLEL_DRAFTING_TOKEN = "DrafterLacksParallelDraftingToken"
    EAGLE3_DECLARED_NOT_IMPLEMENTED = "Eagle3DeclaredNotImplemented"
    EXPERTS_DIVISIBLE = "ExpertsDivisible"
    EXPERTS_NOT_DIVISIBLE = "ExpertsNotDivisible"
    EXTRA_ARGS_OVERRIDE_OWNED_FLAG = "ExtraArgsOverrideOwnedFlag"
    GPUS_DO_NOT_FILL_NODES = "GPUsDoNotFillNodes"
    GPUS_FILL_NODES = "GPUsFillNodes"
    METHOD_EXPLICIT = "MethodExplicit"
    NO_DRAFTER = "NoDrafter"
    PAIRED = "Paired"
    PIPELINE_PARALLEL_SUPPORTED = "PipelineParallelSupported"
    PREFLIGHT_DISABLED = "PreflightDisabled"
    PROBE_FAILED = "ProbeFailed"
    PROBE_DEADLINE_EXCEEDED = "ProbeDeadlineExceeded"
    PROBE_IMAGE_PULL_FAILED = "ProbeImagePullFailed"
    PROBE_REPORT_MISSING = "ProbeReportMissing"
    PROBE_RUNNING = "ProbeRunning"
    PROBED = "Probed"
    SPECULATIVE_TOKENS_NOT_DIVISIBLE = "SpeculativeTokensNotDivisible"
    TARGET_LACKS_AUX_HIDDEN_STATES_OVER_PP = "TargetLacksAuxHiddenStatesOverPP"
    TARGET_LACKS_EAGLE3 = "TargetLacksEagle3"
    TARGET_ARCHITECTURE_MISMATCH = "TargetArchitectureMismatch"
    TARGET_SUPPORTS_EAGLE3 = "TargetSupportsEagle3"
    TENSOR_SIZE_DIVIDES_HEADS = "TensorSizeDividesHeads"
    TENSOR_SIZE_DOES_NOT_DIVIDE_HEADS = "TensorSizeDoesNotDivideHeads"
    VLLM_TOO_OLD = "VLLMTooOld"
    VERIFIED = "Verified"
    VERSION_KNOWN = "VersionKnown"
    VERSION_NOT_IN_TABLE = "VersionNotInTable"
    VERSION_PROBED = "VersionProbed"
    VERSION_UNKNOWN = "VersionUnknown"
    DRAFTER_ARCHITECTURE_UNSUPPORTED_BY_METHOD = "DrafterArchitectureUnsupportedByMethod"
    DRAFTER_LOADABLE_BY_METHOD = "DrafterLoadableByMethod"
    SPECULATIVE_CONFIG_REFUSED = "SpeculativeConfigRefused"
    SERVE_FLAG_UNKNOWN = "ServeFlagUnknown"
    SERVE_ARGS_REFUSED = "ServeArgsRefused"
    SERVE_ARGS_ACCEPTED = "ServeArgsAccepted"
    ENGINE_CONFIG_REFUSED = "EngineConfigRefused"
    ENGINE_CONFIG_BUILT = "EngineConfigBuilt"
    MODEL_CONSTRUCTION_REFUSED = "ModelConstructionRefused"
    MODELS_CONSTRUCTED = "ModelsConstructed"
    MAX_MODEL_LEN_TOO_LONG = "MaxModelLenTooLong"
    MAX_MODEL_LEN_FITS = "MaxModelLenFits"
    TARGET_LACKS_MTP_LAYERS = "TargetLacksMTPLayers"
    SPECULATIVE_TOKENS_REQUIRED = "SpeculativeTokensRequired"
    DRAFT_REFUSES_EXPERT_PARALLEL = "DraftRefusesExpertParallel"
    DRAFT_REFUSES_PIPELINE_PARALLEL = "DraftRefusesPipelineParallel"
    # ModelCached, and Progressing while the weights are not there yet
    CACHE_READY = "CacheReady"
    WAITING_FOR_VOLUME = "WaitingForVolume"
    DOWNLOADING = "Downloading"
    VERIFYING = "Verifying"
    DOWNLOAD_FAILED = "DownloadFailed"
    MODEL_CACHE_TOO_SMALL = "ModelCacheTooSmall"
    NO_MODEL_CACHE = "NoModelCache"
    WAITING_FOR_MODEL_CACHE = "WaitingForModelCache"
    # CanaryVerified
    CANARY_OBSERVING = "CanaryObserving"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    CANARY_HELD = "CanaryHeld"
    # SpeculationEffective
    ACCEPTANCE_ABOVE_MINIMUM = "AcceptanceAboveMinimum"
    ACCEPTANCE_BELOW_MINIMUM = "AcceptanceBelowMinimum"
    MEASURING_ACCEPTANCE = "MeasuringAcceptance"
    NO_TRAFFIC = "NoTraffic"
    # InterNodeFabric
    RDMA_REQUESTED = "RDMARequested"
    SECONDARY_NETWORK = "SecondaryNetwork"
    NO_RDMA_FABRIC = "NoRDMAFabric"


# Flags the operator generates; extraArgs may not set them, in any spelling vLLM reads as
# them (api/flags.py; the CRD rejects them too). --config reads more flags from a file.
OWNED_FLAGS: Final = (
    "--model",
    "--served-model-name",
    "--revision",
    "--tensor-parallel-size",
    "-tp",
    "--pipeline-parallel-size",
    "-pp",
    "--decode-context-parallel-size",
    "-dcp",
    "--enable-expert-parallel",
    "-ep",
    "--distributed-executor-backend",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--port",
    "--host",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-cache-dtype",
    "--language-model-only",
    "--speculative-config",
    "--spec-method",
    "--spec-model",
    "--spec-tokens",
    "--config",
    "--data-parallel-size",
    "-dp",
)
# With spec.disaggregation the operator also writes the KV transfer: these are refused in
# extraArgs there (elsewhere a KV connector for offloading is the user's to set).
TRANSFER_FLAGS: Final = (
    "--kv-transfer-config",
    "--disable-hybrid-kv-cache-manager",
    "--no-disable-hybrid-kv-cache-manager",
)

# A container waiting for its image with one of these will not start by itself.
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")

# The serving pods' own volumes and where they are mounted: spec.pod.volumes and
# volumeMounts may use neither (the CRD's rules say the same).
SERVING_VOLUMES = ("dshm", "hf-cache", "model-cache", "model", "drafter", "tmp")
SERVING_MOUNT_PATHS = ("/dev/shm", "/cache", "/model-cache", "/models", "/drafter", "/tmp")
