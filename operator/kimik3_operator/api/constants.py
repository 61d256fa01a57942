"""Group, labels, annotations, condition types and reasons: the stable vocabulary of the API."""

from __future__ import annotations

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
# On the probe Job: the report its pod gave, kept once read (the pod may be collected).
PROBE_REPORT_ANNOTATION: Final = f"{GROUP}/probe-report"
OPERATOR_NAME: Final = "kimik3-operator"
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
COMPONENT_MODEL_CACHE: Final = "model-cache"


class ConditionType:
    CAPABILITIES_VERIFIED: Final = "CapabilitiesVerified"
    DRAFTER_PAIRED: Final = "DrafterPaired"
    PROGRESSING: Final = "Progressing"
    AVAILABLE: Final = "Available"
    DEGRADED: Final = "Degraded"
    SPECULATION_EFFECTIVE: Final = "SpeculationEffective"
    MODEL_CACHED: Final = "ModelCached"


class Reason:
    """Condition reasons. They are an API: alerts and scripts match on them."""

    # Progressing / Available
    WAITING_FOR_LEADER_WORKER_SET: Final = "WaitingForLeaderWorkerSet"
    GROUPS_STARTING: Final = "GroupsStarting"
    ROLLING_UPDATE: Final = "RollingUpdate"
    AVAILABLE: Final = "Available"
    NO_GROUP_READY: Final = "NoGroupReady"
    SOME_GROUPS_READY: Final = "SomeGroupsReady"
    SCALED_TO_ZERO: Final = "ScaledToZero"
    # Degraded
    AS_EXPECTED: Final = "AsExpected"
    INVALID_SPEC: Final = "InvalidSpec"
    LEADER_WORKER_SET_CRD_MISSING: Final = "LeaderWorkerSetCRDMissing"
    POD_CRASH_LOOPING: Final = "PodCrashLooping"
    POD_OOM_KILLED: Final = "PodOOMKilled"
    IMAGE_PULL_FAILED: Final = "ImagePullFailed"
    INSUFFICIENT_GPUS: Final = "InsufficientGPUs"
    NODE_LOST: Final = "NodeLost"
    UNSCHEDULABLE: Final = "Unschedulable"
    APPLY_FAILED: Final = "ApplyFailed"
    NAME_CONFLICT: Final = "NameConflict"
    RECONCILE_FAILED: Final = "ReconcileFailed"
    STATUS_FIELD_IGNORED: Final = "StatusFieldIgnored"
    PREFLIGHT_FAILED: Final = "PreflightFailed"
    WAITING_FOR_PREFLIGHT: Final = "WaitingForPreflight"
    # Preflight (CapabilitiesVerified, DrafterPaired) and the image probe
    ARCHITECTURE_NOT_REGISTERED: Final = "ArchitectureNotRegistered"
    ARCHITECTURE_REGISTERED: Final = "ArchitectureRegistered"
    AUTO_PAIRED: Final = "AutoPaired"
    DSPARK_REFUSES_DECODE_CONTEXT_PARALLEL: Final = "DSparkRefusesDecodeContextParallel"
    DSPARK_REFUSES_PIPELINE_PARALLEL: Final = "DSparkRefusesPipelineParallel"
    DECODE_CONTEXT_PARALLEL_SUPPORTED: Final = "DecodeContextParallelSupported"
    DRAFT_TENSOR_PARALLEL_SIZE_INVALID: Final = "DraftTensorParallelSizeInvalid"
    DRAFTER_ARCHITECTURE_MISMATCH: Final = "DrafterArchitectureMismatch"
    DRAFTER_NOT_FOUND: Final = "DrafterNotFound"
    DRAFTER_NOT_IMPLEMENTED_ON_PLATFORM: Final = "DrafterNotImplementedOnPlatform"
    DRAFTER_TARGET_LAYERS_INVALID: Final = "DrafterTargetLayersInvalid"
    DRAFTER_VOCABULARY_MISMATCH: Final = "DrafterVocabularyMismatch"
    EAGLE3_DECLARED_NOT_IMPLEMENTED: Final = "Eagle3DeclaredNotImplemented"
    EXPERTS_DIVISIBLE: Final = "ExpertsDivisible"
    EXPERTS_NOT_DIVISIBLE: Final = "ExpertsNotDivisible"
    EXTRA_ARGS_OVERRIDE_OWNED_FLAG: Final = "ExtraArgsOverrideOwnedFlag"
    GPUS_DO_NOT_FILL_NODES: Final = "GPUsDoNotFillNodes"
    GPUS_FILL_NODES: Final = "GPUsFillNodes"
    METHOD_EXPLICIT: Final = "MethodExplicit"
    NO_DRAFTER: Final = "NoDrafter"
    PAIRED: Final = "Paired"
    PIPELINE_PARALLEL_SUPPORTED: Final = "PipelineParallelSupported"
    PREFLIGHT_DISABLED: Final = "PreflightDisabled"
    PROBE_FAILED: Final = "ProbeFailed"
    PROBE_DEADLINE_EXCEEDED: Final = "ProbeDeadlineExceeded"
    PROBE_IMAGE_PULL_FAILED: Final = "ProbeImagePullFailed"
    PROBE_REPORT_MISSING: Final = "ProbeReportMissing"
    PROBE_RUNNING: Final = "ProbeRunning"
    PROBED: Final = "Probed"
    SPECULATIVE_TOKENS_NOT_DIVISIBLE: Final = "SpeculativeTokensNotDivisible"
    TARGET_LACKS_AUX_HIDDEN_STATES_OVER_PP: Final = "TargetLacksAuxHiddenStatesOverPP"
    TARGET_LACKS_EAGLE3: Final = "TargetLacksEagle3"
    TARGET_SUPPORTS_EAGLE3: Final = "TargetSupportsEagle3"
    TENSOR_SIZE_DIVIDES_HEADS: Final = "TensorSizeDividesHeads"
    TENSOR_SIZE_DOES_NOT_DIVIDE_HEADS: Final = "TensorSizeDoesNotDivideHeads"
    VLLM_TOO_OLD: Final = "VLLMTooOld"
    VERIFIED: Final = "Verified"
    VERSION_KNOWN: Final = "VersionKnown"
    VERSION_NOT_IN_TABLE: Final = "VersionNotInTable"
    VERSION_PROBED: Final = "VersionProbed"
    VERSION_UNKNOWN: Final = "VersionUnknown"
    DRAFTER_ARCHITECTURE_UNSUPPORTED_BY_METHOD: Final = "DrafterArchitectureUnsupportedByMethod"
    DRAFTER_LOADABLE_BY_METHOD: Final = "DrafterLoadableByMethod"
    SPECULATIVE_CONFIG_REFUSED: Final = "SpeculativeConfigRefused"
    SERVE_FLAG_UNKNOWN: Final = "ServeFlagUnknown"
    SERVE_ARGS_REFUSED: Final = "ServeArgsRefused"
    SERVE_ARGS_ACCEPTED: Final = "ServeArgsAccepted"
    # ModelCached, and Progressing while the weights are not there yet
    CACHE_READY: Final = "CacheReady"
    WAITING_FOR_VOLUME: Final = "WaitingForVolume"
    DOWNLOADING: Final = "Downloading"
    VERIFYING: Final = "Verifying"
    DOWNLOAD_FAILED: Final = "DownloadFailed"
    WAITING_FOR_MODEL_CACHE: Final = "WaitingForModelCache"
    # SpeculationEffective
    ACCEPTANCE_ABOVE_MINIMUM: Final = "AcceptanceAboveMinimum"
    ACCEPTANCE_BELOW_MINIMUM: Final = "AcceptanceBelowMinimum"
    MEASURING_ACCEPTANCE: Final = "MeasuringAcceptance"
    NO_TRAFFIC: Final = "NoTraffic"


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
)
