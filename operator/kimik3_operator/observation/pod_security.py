"""The Kubernetes Pod Security Standards, as the API server's PodSecurity admission applies
them to a pod: which fields of a pod spec a namespace's enforced level refuses. Pure: a pod
spec and a level in, the violations out, so the operator can tell before it applies anything
whether the namespace will admit the pods it is about to make.

The checks are the standards' controls for Linux pods (kubernetes.io/docs/concepts/security/
pod-security-standards), with the versions at which the restricted ones began to apply."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

Level = Literal["privileged", "baseline", "restricted"]
LEVELS: Final[tuple[Level, ...]] = ("privileged", "baseline", "restricted")
ENFORCE_LABEL: Final = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL: Final = "pod-security.kubernetes.io/enforce-version"

BASELINE_CAPABILITIES: Final = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES: Final = frozenset({"NET_BIND_SERVICE"})
RESTRICTED_VOLUMES: Final = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS: Final = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
SELINUX_TYPES: Final = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
VOLUME_SOURCES: Final = frozenset(
    {
        "hostPath",
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
        "awsElasticBlockStore",
        "azureDisk",
        "azureFile",
        "cephfs",
        "cinder",
        "fc",
        "flexVolume",
        "flocker",
        "gcePersistentDisk",
        "gitRepo",
        "glusterfs",
        "image",
        "iscsi",
        "nfs",
        "photonPersistentDisk",
        "portworxVolume",
        "quobyte",
        "rbd",
        "scaleIO",
        "storageos",
        "vsphereVolume",
    }
)
VERSION: Final = re.compile(r"^v1\.([0-9]+)$")
# The minor version that stands for "latest" in the version-dependent controls.
LATEST_MINOR: Final = 10_000


@dataclass(frozen=True)
class Violation:
    """One field of a pod that the level refuses: where, what it holds, which control."""

    field: str
    value: str
    control: str
    level: Level

    def __str__(self) -> str:
        return f"{self.field}={self.value} ({self.control}, refused by {self.level})"


@dataclass(frozen=True)
class Policy:
    """A namespace's enforced level and the standards' version it pins."""

    level: Level
    version: str = "latest"
    # The namespace's label could not be read as a level: PodSecurity then enforces
    # restricted, and says so in its refusal.
    invalid: str = ""

    @property
    def minor(self) -> int:
        found = VERSION.match(self.version)
        return int(found.group(1)) if found else LATEST_MINOR


def namespace_policy(labels: Mapping[str, str] | None) -> Policy:
    """The enforce level and version a namespace's labels ask for. No label: privileged (the
    API server's default unless its admission configuration says otherwise). A label that
    is not a level: restricted, as PodSecurity evaluates it."""
    labels = labels or {}
    raw_level = labels.get(ENFORCE_LABEL)
    raw_version = labels.get(ENFORCE_VERSION_LABEL, "latest") or "latest"
    version = raw_version if raw_version == "latest" or VERSION.match(raw_version) else "latest"
    if raw_level is None:
        return Policy("privileged", version)
    if raw_level not in LEVELS:
        return Policy("restricted", "latest", invalid=f"{ENFORCE_LABEL}={raw_level}")
    level: Level = raw_level
    if version != raw_version:
        return Policy("restricted", "latest", invalid=f"{ENFORCE_VERSION_LABEL}={raw_version}")
    return Policy(level, version)


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod.get(kind) or []:
            if isinstance(container, Mapping):
                yield f"spec.{kind}[{container.get('name', '?')}]", container


def _context(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found = obj.get("securityContext")
    return found if isinstance(found, Mapping) else {}


def _baseline(pod: Mapping[str, Any]) -> Iterator[Violation]:
    pod_context = _context(pod)
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            yield Violation(f"spec.{key}", "true", "host namespaces", "baseline")
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        yield Violation(
            "spec.securityContext.windowsOptions.hostProcess", "true", "HostProcess", "baseline"
        )
    for volume in pod.get("volumes") or []:
        if isinstance(volume, Mapping) and "hostPath" in volume:
            yield Violation(
                f"spec.volumes[{volume.get('name', '?')}].hostPath",
                str((volume.get("hostPath") or {}).get("path", "")),
                "hostPath volumes",
                "baseline",
            )
    for sysctl in pod_context.get("sysctls") or []:
        name = str((sysctl or {}).get("name", ""))
        if name not in SAFE_SYSCTLS:
            yield Violation("spec.securityContext.sysctls", name, "sysctls", "baseline")
    yield from _seccomp_unconfined("spec.securityContext", pod_context)
    yield from _selinux("spec.securityContext", pod_context)
    yield from _apparmor("spec.securityContext", pod_context)
    for path, container in _containers(pod):
        context = _context(container)
        if context.get("privileged"):
            yield Violation(f"{path}.securityContext.privileged", "true", "privileged", "baseline")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            yield Violation(
                f"{path}.securityContext.windowsOptions.hostProcess",
                "true",
                "HostProcess",
                "baseline",
            )
        added = [str(a) for a in (context.get("capabilities") or {}).get("add") or []]
        beyond = sorted(set(added) - BASELINE_CAPABILITIES)
        if beyond:
            yield Violation(
                f"{path}.securityContext.capabilities.add",
                ",".join(beyond),
                "capabilities",
                "baseline",
            )
        for port in container.get("ports") or []:
            if isinstance(port, Mapping) and port.get("hostPort"):
                yield Violation(
                    f"{path}.ports.hostPort", str(port["hostPort"]), "host ports", "baseline"
                )
        if context.get("procMount", "Default") != "Default":
            yield Violation(
                f"{path}.securityContext.procMount",
                str(context["procMount"]),
                "/proc mount type",
                "baseline",
            )
        yield from _seccomp_unconfined(f"{path}.securityContext", context)
        yield from _selinux(f"{path}.securityContext", context)
        yield from _apparmor(f"{path}.securityContext", context)


def _seccomp_unconfined(path: str, context: Mapping[str, Any]) -> Iterator[Violation]:
    kind = (context.get("seccompProfile") or {}).get("type")
    if kind == "Unconfined":
        yield Violation(f"{path}.seccompProfile.type", "Unconfined", "seccomp", "baseline")


def _apparmor(path: str, context: Mapping[str, Any]) -> Iterator[Violation]:
    kind = (context.get("appArmorProfile") or {}).get("type")
    if kind == "Unconfined":
        yield Violation(f"{path}.appArmorProfile.type", "Unconfined", "AppArmor", "baseline")


def _selinux(path: str, context: Mapping[str, Any]) -> Iterator[Violation]:
    options = context.get("seLinuxOptions") or {}
    if str(options.get("type", "")) not in SELINUX_TYPES:
        yield Violation(f"{path}.seLinuxOptions.type", str(options["type"]), "SELinux", "baseline")
    for key in ("user", "role"):
        if options.get(key):
            yield Violation(
                f"{path}.seLinuxOptions.{key}", str(options[key]), "SELinux", "baseline"
            )


def _restricted(pod: Mapping[str, Any], minor: int) -> Iterator[Violation]:
    pod_context = _context(pod)
    for volume in pod.get("volumes") or []:
        if not isinstance(volume, Mapping):
            continue
        kinds = [k for k in volume if k in VOLUME_SOURCES and k not in RESTRICTED_VOLUMES]
        for kind in kinds:
            yield Violation(
                f"spec.volumes[{volume.get('name', '?')}].{kind}",
                kind,
                "volume types",
                "restricted",
            )
    pod_non_root = pod_context.get("runAsNonRoot")
    pod_user = pod_context.get("runAsUser")
    if minor >= 23 and pod_user == 0:
        yield Violation(
            "spec.securityContext.runAsUser", "0", "running as non-root user", "restricted"
        )
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    for path, container in _containers(pod):
        context = _context(container)
        if minor >= 8 and context.get("allowPrivilegeEscalation") is not False:
            yield Violation(
                f"{path}.securityContext.allowPrivilegeEscalation",
                str(context.get("allowPrivilegeEscalation", "unset")).lower(),
                "privilege escalation",
                "restricted",
            )
        non_root = context.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            yield Violation(
                f"{path}.securityContext.runAsNonRoot",
                str(non_root if non_root is not None else "unset").lower(),
                "running as non-root",
                "restricted",
            )
        if minor >= 23 and context.get("runAsUser") == 0:
            yield Violation(
                f"{path}.securityContext.runAsUser", "0", "running as non-root user", "restricted"
            )
        seccomp = (context.get("seccompProfile") or {}).get("type", pod_seccomp)
        if minor >= 19 and seccomp not in ("RuntimeDefault", "Localhost"):
            yield Violation(
                f"{path}.securityContext.seccompProfile.type",
                str(seccomp or "unset"),
                "seccomp",
                "restricted",
            )
        if minor >= 22:
            capabilities = context.get("capabilities") or {}
            if "ALL" not in [str(d) for d in capabilities.get("drop") or []]:
                yield Violation(
                    f"{path}.securityContext.capabilities.drop",
                    ",".join(str(d) for d in capabilities.get("drop") or []) or "unset",
                    "capabilities",
                    "restricted",
                )
            added = {str(a) for a in capabilities.get("add") or []}
            beyond = sorted(added - RESTRICTED_CAPABILITIES)
            if beyond:
                yield Violation(
                    f"{path}.securityContext.capabilities.add",
                    ",".join(beyond),
                    "capabilities",
                    "restricted",
                )


def violations(pod: Mapping[str, Any], policy: Policy) -> list[Violation]:
    """What of ``pod`` (a pod's spec) the policy's level refuses, baseline's controls first;
    a field that both levels refuse is named once, for the lower level."""
    if policy.level == "privileged":
        return []
    found = list(_baseline(pod))
    if policy.level == "restricted":
        named = {v.field for v in found}
        found += [v for v in _restricted(pod, policy.minor) if v.field not in named]
    return found
