"""Rules that make a spec unreadable, checked at parse time (InvalidSpec).

The CRD states them too (ranges, CEL), so the API server rejects them at ``kubectl apply``;
the operator checks them again for resources stored before the schema had them. Rules about
whether a readable spec can run (GPUs filling nodes, the draft tensor size, ...) are the
preflight's, so they carry a finding and a stable reason.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api.flags import owned_flag, transfer_flag
from kimik3_operator.api.names import MAX_REPLICAS
from kimik3_operator.api.quantities import quantity_bytes
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import (
    CHECKPOINT_METHODS,
    DISAGGREGATED_ROLES,
    ParallelismSpec,
    SpecError,
    duration_seconds,
    json_name,
)

PERCENT = re.compile(r"^[0-9]+%$")
# The CRD's patterns for spec.model.architecture and spec.drafter.source.pvc.path.
ARCHITECTURE = re.compile(r"^[A-Z][A-Za-z0-9_]{0,99}$")
DRAFTER_PATH = re.compile(r"^[A-Za-z0-9._/-]{0,253}$")
# Control characters (tab and newline aside) cannot travel into the children: the API
# server's apply decoder refuses them, so the spec is refused here, with its field.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffe\uffff]")

# Each leader's samples are kept for the canary's window: its length bounds their number.
MAX_CANARY_WINDOW_SECONDS = 6 * 3600
# The CRD's bound on spec.engine.env's values together: what the operator holds per resource.
MAX_ENV_BYTES = 64 * 1024
MAX_EXTRA_ARGS_BYTES = 32 * 1024
# spec.model.config and spec.drafter.config (the CRD's maxLength), and how deep their JSON
# may nest: a config.json is a few levels deep.
MAX_CONFIG_BYTES = 32 * 1024
MAX_CONFIG_DEPTH = 16


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _strings(getattr(value, f.name), f"{path}.{json_name(f)}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key, f"{path}[key]")
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


def _drafter_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    """The drafter's source against its method: the CRD's rules, for resources written
    before them, and the path a volume's drafter may take."""
    drafter, found = spec.drafter, []
    method = drafter.method
    if drafter.source is not None and method in ("ngram", "none"):
        found.append(
            SpecError(
                "spec.drafter.source",
                drafter.source.pvc.claim_name,
                f"is set while drafter.method is {method}, which loads no drafter",
                "remove drafter.source",
            )
        )
    if drafter.source is not None and drafter.repo:
        found.append(
            SpecError("spec.drafter.repo", drafter.repo, "is set beside drafter.source", "keep one")
        )
    if method == "ngram" and drafter.repo:
        found.append(
            SpecError(
                "spec.drafter.repo",
                drafter.repo,
                "is set while drafter.method is ngram, which drafts from the prompt itself",
                "remove drafter.repo",
            )
        )
    if method == "ngram" and drafter.num_speculative_tokens is None:
        found.append(
            SpecError(
                "spec.drafter.numSpeculativeTokens",
                None,
                "is required by drafter.method ngram (vLLM has no default for it)",
                "set it, for example to 3",
            )
        )
    if drafter.source is not None:
        pvc = drafter.source.pvc
        if not pvc.claim_name:
            found.append(
                SpecError(
                    "spec.drafter.source.pvc.claimName",
                    "",
                    "a PVC source must name its claim",
                    "set claimName to the PersistentVolumeClaim holding the drafter",
                )
            )
        if ".." in pvc.path.split("/") or not DRAFTER_PATH.match(pvc.path):
            found.append(
                SpecError(
                    "spec.drafter.source.pvc.path",
                    pvc.path[:253],
                    "must be a directory inside the volume",
                    "use letters, digits, '.', '_', '-' and '/', without '..'",
                )
            )
    return found


def errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    found: list[SpecError] = []
    par, place, drafter = spec.parallelism, spec.placement, spec.drafter
    if spec.replicas < 0:
        found.append(SpecError("spec.replicas", spec.replicas, "must not be negative"))
    found += _parallelism_errors(par, "spec.parallelism")
    if place.gpus_per_node < 1:
        found.append(
            SpecError("spec.placement.gpusPerNode", place.gpus_per_node, "must be at least 1")
        )
    if drafter.method == "none" and drafter.repo:
        found.append(
            SpecError(
                "spec.drafter.repo",
                drafter.repo,
                "is set while drafter.method is none",
                "remove drafter.repo or choose a method",
            )
        )
    found += _drafter_errors(spec)
    found += _config_errors(spec)
    if not ARCHITECTURE.match(spec.model.architecture):
        found.append(
            SpecError(
                "spec.model.architecture",
                spec.model.architecture[:100],
                "is not a vLLM model class name",
                "write the class from the checkpoint's config.json, e.g. KimiLinearForCausalLM",
            )
        )
    if drafter.num_speculative_tokens is not None and drafter.num_speculative_tokens < 1:
        found.append(
            SpecError(
                "spec.drafter.numSpeculativeTokens",
                drafter.num_speculative_tokens,
                "must be at least 1",
            )
        )
    source = spec.model.source
    if source.pvc is not None and source.hugging_face is not None:
        found.append(
            SpecError(
                "spec.model.source",
                "huggingFace and pvc",
                "names two weight sources",
                "keep exactly one",
            )
        )
    if source.pvc is not None and not source.pvc.claim_name:
        found.append(
            SpecError(
                "spec.model.source.pvc.claimName",
                "",
                "a PVC source must name its claim",
                "set claimName to the PersistentVolumeClaim holding the weights",
            )
        )
    if not QUANTITY.match(spec.resources.shared_memory):
        found.append(
            SpecError(
                "spec.resources.sharedMemory",
                spec.resources.shared_memory,
                "is not a memory quantity",
                'write it as 64Gi or "64G"',
            )
        )
    found += _cache_errors(spec)
    found += _security_errors(spec)
    rollout: tuple[tuple[str, int | str], ...] = (
        ("maxSurge", spec.rollout.max_surge),
        ("maxUnavailable", spec.rollout.max_unavailable),
    )
    for name, amount in rollout:
        if isinstance(amount, str) and not PERCENT.match(amount):
            found.append(
                SpecError(
                    f"spec.rollout.{name}",
                    amount,
                    "must be a number of groups or a percentage",
                    'write it as 1 or "25%"',
                )
            )
        elif isinstance(amount, int) and amount < 0:
            found.append(SpecError(f"spec.rollout.{name}", amount, "must not be negative"))
    if not 1 <= spec.rollout.max_startup_failures <= 100:
        found.append(
            SpecError(
                "spec.rollout.maxStartupFailures",
                spec.rollout.max_startup_failures,
                "must be between 1 and 100",
                "3 parks a deployment after its third start-up failure",
            )
        )
    found += _canary_errors(spec)
    found += _size_errors(spec)
    found += _pod_errors(spec)
    found += _scheduling_errors(spec)
    found += _autoscaling_errors(spec)
    found += _routing_errors(spec)
    found += _disaggregation_errors(spec)
    for path, text in _strings(spec, "spec"):
        if CONTROL.search(text):
            found.append(SpecError(path, text[:80], "contains a control character", "remove it"))
            break
    return found


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# A CPU amount: cores, or thousandths of one.
CPU = re.compile(r"^([0-9]+(\.[0-9]{1,3})?|[0-9]+m)$")
# Linux IDs: the CRD's bounds (int64 in the API; above 2^31-1 no runtime accepts them).
MAX_ID = 2**31 - 1


def _security_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    """The serving pods' user and CPU amounts: the CRD's rules, for resources written before
    them."""
    found: list[SpecError] = []
    for name, amount in (("cpu", spec.resources.cpu), ("cpuLimit", spec.resources.cpu_limit)):
        if amount and not CPU.match(amount):
            found.append(
                SpecError(
                    f"spec.resources.{name}",
                    amount,
                    "is not a CPU quantity",
                    'write it as 8, "2.5" or 500m',
                )
            )
    security = spec.security_context
    for name, value in (
        ("runAsUser", security.run_as_user),
        ("runAsGroup", security.run_as_group),
        ("fsGroup", security.fs_group),
    ):
        if value is not None and not 0 <= value <= MAX_ID:
            found.append(SpecError(f"spec.securityContext.{name}", value, f"must be 0 to {MAX_ID}"))
    if security.run_as_non_root is True and security.run_as_user == 0:
        found.append(
            SpecError(
                "spec.securityContext.runAsUser",
                0,
                "is root while securityContext.runAsNonRoot is true: the kubelet would refuse "
                "to start every pod",
                "name a non-zero user, or set runAsNonRoot to false",
            )
        )
    return found


def _cache_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    cache = spec.model.cache
    if cache is None:
        return []
    found: list[SpecError] = []
    if spec.model.source.pvc is not None:
        found.append(
            SpecError(
                "spec.model.cache",
                "set with model.source.pvc",
                "a PVC source is already a volume of weights",
                "remove model.cache, or use model.source.huggingFace with the cache",
            )
        )
    if cache.access_mode == "ReadOnlyMany" and not cache.claim_name:
        found.append(
            SpecError(
                "spec.model.cache.accessMode",
                cache.access_mode,
                "a read-only cache must be a volume you filled",
                "name it in model.cache.claimName, or use ReadWriteMany for the operator's own",
            )
        )
    if not 1 <= cache.connections <= 64:
        found.append(
            SpecError(
                "spec.model.cache.connections",
                cache.connections,
                "must be between 1 and 64",
                "32 (the default) fills most links; raise it where each connection is slow",
            )
        )
    if not QUANTITY.match(cache.chunk_size) or not (
        1 << 20 <= quantity_bytes(cache.chunk_size) <= 1 << 30
    ):
        found.append(
            SpecError(
                "spec.model.cache.chunkSize",
                cache.chunk_size,
                "must be a size between 1Mi and 1Gi",
                'write it as "16Mi" (the default) or "64Mi"',
            )
        )
    if not QUANTITY.match(cache.size):
        found.append(
            SpecError(
                "spec.model.cache.size",
                cache.size,
                "is not a storage quantity",
                'write it as 2Ti or "1800Gi"',
            )
        )
    return found


def checkpoint_config(text: str) -> dict[str, Any]:
    """A config.json given as text in the spec, as its object; ValueError says why not."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"is over {MAX_CONFIG_BYTES // 1024} KiB")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_CONFIG_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(value, dict):
        raise ValueError("is not a JSON object")
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ValueError(f"nests deeper than {MAX_CONFIG_DEPTH} levels")
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


def _config_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    found: list[SpecError] = []
    for path, text in (
        ("spec.model.config", spec.model.config),
        ("spec.drafter.config", spec.drafter.config),
    ):
        if not text:
            continue
        try:
            checkpoint_config(text)
        except ValueError as exc:
            found.append(
                SpecError(
                    path,
                    text[:80],
                    str(exc),
                    "paste the checkpoint's config.json as it is, or leave it out",
                )
            )
    if spec.drafter.config and spec.drafter.method not in CHECKPOINT_METHODS:
        found.append(
            SpecError(
                "spec.drafter.config",
                spec.drafter.config[:80],
                f"is set while drafter.method is {spec.drafter.method}, which loads no "
                "drafter checkpoint",
                "remove drafter.config or choose a method with a drafter",
            )
        )
    return found


def first_error(spec: KimiK3DeploymentSpec) -> SpecError | None:
    found = errors(spec)
    return found[0] if found else None


def _canary_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    canary = spec.rollout.canary
    if canary is None:
        return []
    found: list[SpecError] = []
    if not 1 <= canary.groups <= 1000:
        found.append(
            SpecError(
                "spec.rollout.canary.groups",
                canary.groups,
                "must be between 1 and 1000",
                "1 updates one group first and compares it with the others",
            )
        )
    for name, text in (("window", canary.window), ("readyTimeout", canary.ready_timeout)):
        if duration_seconds(text) <= 0:
            found.append(
                SpecError(
                    f"spec.rollout.canary.{name}",
                    text,
                    "is not a duration",
                    "write it as 90s, 15m or 1h30m",
                )
            )
    if duration_seconds(canary.window) > MAX_CANARY_WINDOW_SECONDS:
        found.append(
            SpecError(
                "spec.rollout.canary.window",
                canary.window,
                "is over 6h, the longest the operator keeps each leader's samples for",
                "observe for at most 6h (a few acceptance windows are enough)",
            )
        )
    rate = canary.min_acceptance_rate
    if rate is not None and not 0.0 <= rate <= 1.0:
        found.append(
            SpecError("spec.rollout.canary.minAcceptanceRate", rate, "must be between 0 and 1")
        )
    if not 0.0 <= canary.max_acceptance_drop <= 1.0:
        found.append(
            SpecError(
                "spec.rollout.canary.maxAcceptanceDrop",
                canary.max_acceptance_drop,
                "must be between 0 and 1",
                "0.1 lets the canary's acceptance be at most 10% below the stable groups'",
            )
        )
    return found


def _size_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    """The schema's totals, which bound what the operator holds and writes per resource."""
    found: list[SpecError] = []
    env = sum(len(str(e.get("value") or "")) for e in spec.engine.env)
    if env > MAX_ENV_BYTES:
        found.append(
            SpecError(
                "spec.engine.env",
                f"{env} characters of values",
                f"the values together are over {MAX_ENV_BYTES // 1024} KiB",
                "move the large ones into a ConfigMap or Secret and reference them with valueFrom",
            )
        )
    for index, entry in enumerate(spec.engine.env):
        path = f"spec.engine.env[{index}]"
        source = entry.get("valueFrom")
        if "value" in entry and source is not None:
            found.append(SpecError(path, entry.get("name"), "takes value or valueFrom, not both"))
        sources = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
        if isinstance(source, Mapping) and sum(1 for k in sources if k in source) != 1:
            found.append(
                SpecError(
                    f"{path}.valueFrom",
                    entry.get("name"),
                    "takes exactly one of secretKeyRef, configMapKeyRef, fieldRef, "
                    "resourceFieldRef",
                )
            )
    args = sum(len(a) for a in spec.engine.extra_args)
    if args > MAX_EXTRA_ARGS_BYTES:
        found.append(
            SpecError(
                "spec.engine.extraArgs",
                f"{args} characters",
                f"together over {MAX_EXTRA_ARGS_BYTES // 1024} KiB",
                "put a long setting in a file (a ConfigMap volume) and pass its path",
            )
        )
    return found


# What spec.pod may not set (the CRD's CEL rules): the operator's and LeaderWorkerSet's
# labels and annotations, and the pods' AppArmor and seccomp profiles.
RESERVED_LABELS = (
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/name",
)
RESERVED_PREFIXES = ("serving.kimik3.io/", "leaderworkerset.sigs.k8s.io/")
KUEUE_PREFIX = "kueue.x-k8s.io/"
# A Kubernetes label key: an optional DNS-subdomain prefix and a name of at most 63.
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PROFILE_PREFIXES = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)


def _pod_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    pod = spec.pod
    found: list[SpecError] = []
    for key in pod.labels:
        if key in RESERVED_LABELS or key.startswith(RESERVED_PREFIXES):
            found.append(
                SpecError(
                    "spec.pod.labels",
                    key,
                    "is a label the operator or LeaderWorkerSet sets",
                    "choose another key",
                )
            )
    for field_name, keys in (("labels", pod.labels), ("annotations", pod.annotations)):
        for key in keys:
            if key.startswith(KUEUE_PREFIX):
                found.append(
                    SpecError(
                        f"spec.pod.{field_name}",
                        key,
                        "is a Kueue key: Kueue would admit each pod alone instead of the group "
                        "whole",
                        "name the queue, priority and topology in spec.scheduling",
                    )
                )
    for key in pod.annotations:
        if key.startswith(PROFILE_PREFIXES + RESERVED_PREFIXES):
            found.append(
                SpecError(
                    "spec.pod.annotations",
                    key,
                    "sets an AppArmor or seccomp profile, or an annotation of the operator or "
                    "LeaderWorkerSet",
                    "remove it: the pods' profiles are the operator's (RuntimeDefault)",
                )
            )
    for name, amount in pod.extra_resources.items():
        if isinstance(amount, bool) or not (
            (isinstance(amount, int) and amount >= 0)
            or (isinstance(amount, str) and amount.isdigit())
        ):
            found.append(
                SpecError(
                    f"spec.pod.extraResources.{name}",
                    amount,
                    "is not a whole number",
                    "extended resources are counted, not measured",
                )
            )
        if "/" not in name or name.startswith(("kubernetes.io/", "requests.")):
            found.append(
                SpecError(
                    "spec.pod.extraResources",
                    name,
                    "is not an extended resource (vendor/name, e.g. rdma/ib)",
                    "cpu, memory and storage are spec.resources'",
                )
            )
        elif name == spec.placement.gpu_resource:
            found.append(
                SpecError(
                    "spec.pod.extraResources",
                    name,
                    "is the GPU resource",
                    "the GPUs per pod follow from parallelism and placement.gpusPerNode",
                )
            )
    found += _volume_errors(pod.volumes, pod.volume_mounts)
    for index, entry in enumerate(pod.env_from):
        if ("configMapRef" in entry) == ("secretRef" in entry):
            found.append(
                SpecError(
                    f"spec.pod.envFrom[{index}]",
                    dict(entry),
                    "takes one of configMapRef and secretRef",
                )
            )
    return found


def _overlaps(path: str, reserved: str) -> bool:
    """``path`` is ``reserved``, above it or below it."""
    path = path.rstrip("/") or "/"
    above = reserved.startswith(path if path == "/" else path + "/")
    return path == reserved or path.startswith(reserved + "/") or above


def _volume_errors(
    volumes: Sequence[Mapping[str, Any]], mounts: Sequence[Mapping[str, Any]]
) -> list[SpecError]:
    found: list[SpecError] = []
    names = set()
    for index, volume in enumerate(volumes):
        name = str(volume.get("name", ""))
        names.add(name)
        if "hostPath" in volume:
            found.append(
                SpecError(
                    f"spec.pod.volumes[{index}].hostPath",
                    volume["hostPath"],
                    "reads the node's filesystem",
                    "use a PersistentVolumeClaim or a CSI volume",
                )
            )
        if name in c.SERVING_VOLUMES:
            found.append(
                SpecError(
                    f"spec.pod.volumes[{index}].name",
                    name,
                    f"is a name the operator's own volumes have ({', '.join(c.SERVING_VOLUMES)})",
                    "choose another",
                )
            )
    for index, mount in enumerate(mounts):
        path = str(mount.get("mountPath", ""))
        taken = [p for p in c.SERVING_MOUNT_PATHS if _overlaps(path, p)]
        if taken:
            found.append(
                SpecError(
                    f"spec.pod.volumeMounts[{index}].mountPath",
                    path,
                    f"is at, above or below the operator's {taken[0]}",
                    "choose another path",
                )
            )
        if mount.get("name") not in names:
            found.append(
                SpecError(
                    f"spec.pod.volumeMounts[{index}].name",
                    mount.get("name"),
                    "names a volume that spec.pod.volumes does not have",
                    "add the volume to spec.pod.volumes",
                )
            )
    return found


# The HPA refuses a stabilization window over an hour.
MAX_STABILIZATION_SECONDS = 3600
MAX_GROUPS = 64


def _autoscaling_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    scaling = spec.autoscaling
    if scaling is None:
        return []
    path = "spec.autoscaling"
    found: list[SpecError] = []
    if not 1 <= scaling.max_replicas <= MAX_GROUPS:
        found.append(
            SpecError(f"{path}.maxReplicas", scaling.max_replicas, f"must be 1 to {MAX_GROUPS}")
        )
    if not 0 <= scaling.min_replicas <= scaling.max_replicas:
        found.append(
            SpecError(
                f"{path}.minReplicas",
                scaling.min_replicas,
                f"must be between 0 and maxReplicas ({scaling.max_replicas})",
            )
        )
    if scaling.min_replicas == 0 and not (scaling.scale_to_zero and spec.model.cache):
        found.append(
            SpecError(
                f"{path}.minReplicas",
                0,
                "scales to zero only with scaleToZero: true and spec.model.cache: the first "
                "request after it waits a whole start-up (weights read from the cache)",
                "set minReplicas: 1, or set both scaleToZero: true and spec.model.cache",
            )
        )
    if scaling.scale_to_zero and scaling.min_replicas != 0:
        found.append(
            SpecError(
                f"{path}.scaleToZero",
                True,
                f"needs minReplicas: 0 (it is {scaling.min_replicas})",
                "set minReplicas: 0, or remove scaleToZero",
            )
        )
    target = scaling.target
    if not 1 <= target.waiting_requests_per_group <= 100_000:
        found.append(
            SpecError(
                f"{path}.target.waitingRequestsPerGroup",
                target.waiting_requests_per_group,
                "must be 1 to 100000",
            )
        )
    usage = target.kv_cache_usage
    if usage is not None and not 0 < usage <= 1:
        found.append(
            SpecError(
                f"{path}.target.kvCacheUsage",
                usage,
                "is a fraction of the KV cache: more than 0, at most 1",
                "0.8 adds a group when the groups' KV caches are 80 % full on average",
            )
        )
    behavior = scaling.behavior
    for name, value in (
        ("scaleUpStabilizationSeconds", behavior.scale_up_stabilization_seconds),
        ("scaleDownStabilizationSeconds", behavior.scale_down_stabilization_seconds),
    ):
        if value is not None and not 0 <= value <= MAX_STABILIZATION_SECONDS:
            found.append(
                SpecError(
                    f"{path}.behavior.{name}",
                    value,
                    f"must be 0 to {MAX_STABILIZATION_SECONDS} (the HPA's limit)",
                )
            )
    if not 5 <= behavior.polling_interval_seconds <= 3600:
        found.append(
            SpecError(
                f"{path}.behavior.pollingIntervalSeconds",
                behavior.polling_interval_seconds,
                "must be 5 to 3600",
            )
        )
    return found


def _scheduling_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    scheduling = spec.scheduling
    found: list[SpecError] = []
    queue = scheduling.queue_name
    if queue and not DNS_LABEL.match(queue):
        found.append(
            SpecError(
                "spec.scheduling.queueName",
                queue[:80],
                "is not a LocalQueue name",
                "use lower-case letters, digits and '-', at most 63",
            )
        )
    priority = scheduling.workload_priority_class_name
    if priority and (len(priority) > 253 or not DNS_SUBDOMAIN.match(priority)):
        found.append(
            SpecError(
                "spec.scheduling.workloadPriorityClassName",
                priority[:80],
                "is not a WorkloadPriorityClass name",
                "use lower-case letters, digits, '-' and '.'",
            )
        )
    topology = scheduling.topology
    if topology is not None:
        if bool(topology.required) == bool(topology.preferred):
            found.append(
                SpecError(
                    "spec.scheduling.topology",
                    {"required": topology.required, "preferred": topology.preferred},
                    "takes exactly one of required and preferred",
                )
            )
        for name, key in (("required", topology.required), ("preferred", topology.preferred)):
            if key and (len(key) > 317 or not LABEL_KEY.match(key)):
                found.append(
                    SpecError(
                        f"spec.scheduling.topology.{name}",
                        key[:80],
                        "is not a node label key",
                        "name a level of Kueue's Topology, e.g. topology.kimik3.io/domain",
                    )
                )
    for name, value in (
        ("topology", topology),
        ("workloadPriorityClassName", priority),
    ):
        if value and not queue:
            found.append(
                SpecError(
                    f"spec.scheduling.{name}",
                    str(value)[:80],
                    "is Kueue's and no queue is named",
                    "name the LocalQueue in spec.scheduling.queueName",
                )
            )
    return found


def _routing_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    routing = spec.routing
    if routing is None:
        return []
    path = "spec.routing"
    found: list[SpecError] = []
    if not 0 < routing.max_acceptance_drop < 1:
        found.append(
            SpecError(
                f"{path}.maxAcceptanceDrop",
                routing.max_acceptance_drop,
                "is a fraction of the median group's acceptance: more than 0, less than 1",
                "0.5 takes a group out of routing while its acceptance is under half the "
                "median group's",
            )
        )
    gateway = routing.gateway
    if gateway is not None:
        if len(gateway.name) > 253 or not DNS_SUBDOMAIN.match(gateway.name):
            found.append(
                SpecError(
                    f"{path}.gateway.name", gateway.name, "is not a Gateway's name (DNS-1123)"
                )
            )
        if gateway.namespace and not DNS_LABEL.match(gateway.namespace):
            found.append(
                SpecError(
                    f"{path}.gateway.namespace",
                    gateway.namespace,
                    "is not a namespace's name (DNS-1123 label)",
                    "leave it empty for the deployment's own namespace",
                )
            )
        if gateway.section_name and not DNS_LABEL.match(gateway.section_name):
            found.append(
                SpecError(
                    f"{path}.gateway.sectionName",
                    gateway.section_name,
                    "is not a listener's name (DNS-1123 label)",
                )
            )
    return found


def _parallelism_errors(par: ParallelismSpec, path: str) -> list[SpecError]:
    return [
        SpecError(f"{path}.{name}", value, "must be at least 1")
        for name, value in (
            ("tensor", par.tensor),
            ("pipeline", par.pipeline),
            ("decodeContext", par.decode_context),
            ("data", par.data),
        )
        if value < 1
    ]


def _data_parallel_error(par: ParallelismSpec, gpus_per_node: int, path: str) -> SpecError | None:
    """vLLM's data-parallel engines of one group are started by one leader here: a group of
    more than one engine stays on one node."""
    gpus = par.tensor * par.pipeline * par.data
    if par.data > 1 and gpus > gpus_per_node:
        return SpecError(
            f"{path}.data",
            par.data,
            f"makes a group of {gpus} GPUs (tensor x pipeline x data), more than one node's "
            f"{gpus_per_node}; data-parallel engines of one group run on one node",
            "lower data or tensor, or serve more groups (replicas) instead",
        )
    return None


def _disaggregation_errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    found: list[SpecError] = []
    error = _data_parallel_error(spec.parallelism, spec.placement.gpus_per_node, "spec.parallelism")
    if error is not None:
        found.append(error)
    disaggregation = spec.disaggregation
    if disaggregation is None:
        return found
    path = "spec.disaggregation"
    for other, present in (
        ("spec.rollout.canary", spec.rollout.canary is not None),
        ("spec.autoscaling", spec.autoscaling is not None),
        ("spec.scheduling.queueName", spec.queued),
    ):
        if present:
            found.append(
                SpecError(
                    other,
                    "set",
                    "cannot be combined with spec.disaggregation: the DisaggregatedSet rolls "
                    "both roles together, the roles have their own replicas, and Kueue does "
                    "not admit a DisaggregatedSet's groups",
                    f"remove {other} or spec.disaggregation",
                )
            )
    if not 0 < disaggregation.max_acceptance_drop < 1:
        found.append(
            SpecError(
                f"{path}.maxAcceptanceDrop",
                disaggregation.max_acceptance_drop,
                "is a fraction of the prefill groups' acceptance: more than 0, less than 1",
            )
        )
    for index, arg in enumerate(spec.engine.extra_args):
        flag = transfer_flag(arg)
        if flag is not None:
            found.append(
                SpecError(
                    f"spec.engine.extraArgs[{index}]",
                    arg[:80],
                    f"sets {flag}, which the operator writes for each role of spec.disaggregation",
                    "remove it; spec.disaggregation.connector chooses the connector",
                )
            )
    for role in DISAGGREGATED_ROLES:
        side = disaggregation.role(role)
        where = f"{path}.{role}"
        if not 0 <= side.replicas <= MAX_REPLICAS:
            found.append(
                SpecError(f"{where}.replicas", side.replicas, f"must be 0 to {MAX_REPLICAS}")
            )
        par = side.parallelism
        if par is not None:
            found += _parallelism_errors(par, f"{where}.parallelism")
            error = _data_parallel_error(par, spec.placement.gpus_per_node, f"{where}.parallelism")
            if error is not None:
                found.append(error)
        if side.resources is not None and not QUANTITY.match(side.resources.shared_memory):
            found.append(
                SpecError(
                    f"{where}.resources.sharedMemory",
                    side.resources.shared_memory,
                    "is not a memory quantity",
                    'write it as 64Gi or "64G"',
                )
            )
        for index, arg in enumerate(side.extra_args):
            flag = owned_flag(arg) or transfer_flag(arg)
            if flag is not None:
                found.append(
                    SpecError(
                        f"{where}.extraArgs[{index}]",
                        arg[:80],
                        f"sets {flag}, which the operator generates from the spec",
                        "use the matching spec field (this role's parallelism, the connector)",
                    )
                )
    return found
