"""Operator settings from KIMIK3_* environment variables, in one place."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from kimik3_operator.api import constants as c


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    resync_seconds: float = 30.0
    health_endpoint: str = "http://0.0.0.0:8080/healthz"
    metrics_port: int = 8081  # 0: no metrics server
    metrics_address: str = "0.0.0.0"
    # Leader election on a Lease of this name (empty: standalone, always active), in
    # lease_namespace; lease_seconds after the leader's last renewal another may take over.
    lease_name: str = ""
    lease_namespace: str = "default"
    lease_seconds: float = 12.0
    identity: str = ""  # this replica's name in the Lease: the pod's name
    scrape_seconds: float = 30.0
    acceptance_window_seconds: float = 300.0
    # Where pods have no network (the end-to-end tests), read every leader's metrics here;
    # {pod} and {namespace} are filled in.
    scrape_url: str = ""
    # Likewise for the download Job's /progress.
    download_progress_url: str = ""
    # Read Nodes and GPU pods cluster-wide to say how many GPUs are free (chart: gpuInventory).
    gpu_inventory: bool = True
    workers: int = 8  # reconciles that may run at once (one per resource at a time)
    scrape_workers: int = 4
    coalesce_seconds: float = 0.1  # events for one resource within this become one reconcile
    # A failed reconcile is retried after 10 ms, doubling each time, up to this.
    retry_max_seconds: float = 300.0
    # Labels on every PodMonitor the operator makes, for a Prometheus that selects monitors
    # by label (kube-prometheus-stack: release=<its release name>). KIMIK3_PODMONITOR_LABELS
    # is k=v,k=v.
    pod_monitor_labels: tuple[tuple[str, str], ...] = ()
    # Kueue runs with its AdmissionGatedBy feature gate (alpha, off by default in v0.17): a
    # queued deployment's groups are made at once and held in the queue, without quota,
    # until the preflight passes (chart: kueue.admissionGatedBy).
    kueue_admission_gate: bool = False
    # ServiceAccounts (names, in any watched namespace) that spec.pod.serviceAccountName may
    # name; the chart's admission policy allows the same (servingServiceAccounts).
    service_accounts: tuple[str, ...] = ()
    # The Prometheus the ScaledObjects of spec.autoscaling query for the leaders' load (the
    # chart's autoscaling.prometheusAddress); it must scrape the operator's PodMonitors.
    prometheus_url: str = c.DEFAULT_PROMETHEUS_URL
    # The endpoint picker spec.routing runs (the chart's routing.endpointPickerImage), and the
    # ClusterRole its RoleBinding in each namespace names (the chart makes it).
    epp_image: str = c.DEFAULT_EPP_IMAGE
    epp_cluster_role: str = c.DEFAULT_EPP_CLUSTER_ROLE
    # A disaggregated deployment's router (routing.pdEndpointPickerImage) and the routing
    # sidecar in front of its decode leaders (disaggregation.routingSidecarImage).
    pd_picker_image: str = c.DEFAULT_PD_PICKER_IMAGE
    routing_sidecar_image: str = c.DEFAULT_ROUTING_SIDECAR_IMAGE
    # Test clusters without GPUs only: a --speculative-config (JSON) used verbatim for
    # resources whose preflight is Disabled, so vLLM's CPU build can run a method it has.

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings, each checked: a bad one raises SettingsError naming the variable,
        its value and what it takes (the operator then exits, and its pod says why)."""
        env = os.environ if env is None else env
        read = _Reader(env)
        namespaces = tuple(
            n.strip() for n in env.get("KIMIK3_NAMESPACES", "").split(",") if n.strip()
        )
        for namespace in namespaces:
            if not DNS_LABEL.match(namespace):
                raise SettingsError(
                    "KIMIK3_NAMESPACES",
                    env.get("KIMIK3_NAMESPACES", ""),
                    f"{namespace!r} is not a namespace name (a DNS label)",
                )
        lease_namespace = env.get("KIMIK3_LEASE_NAMESPACE") or cls.lease_namespace
        if not DNS_LABEL.match(lease_namespace):
            raise SettingsError(
                "KIMIK3_LEASE_NAMESPACE", lease_namespace, "is not a namespace name"
            )
        return cls(
            namespaces=namespaces,
            resync_seconds=read.number("KIMIK3_RESYNC_SECONDS", cls.resync_seconds, 0.1, 86400),
            health_endpoint=read.url("KIMIK3_HEALTH_ENDPOINT", cls.health_endpoint, port=True),
            metrics_port=int(read.number("KIMIK3_METRICS_PORT", cls.metrics_port, 0, 65535, 1)),
            metrics_address=read.address("KIMIK3_METRICS_ADDRESS", cls.metrics_address),
            scrape_seconds=read.number("KIMIK3_SCRAPE_SECONDS", cls.scrape_seconds, 0.1, 3600),
            acceptance_window_seconds=read.number(
                "KIMIK3_ACCEPTANCE_WINDOW_SECONDS", cls.acceptance_window_seconds, 1, 21600
            ),
            scrape_url=read.url("KIMIK3_SCRAPE_URL", cls.scrape_url),
            download_progress_url=read.url(
                "KIMIK3_DOWNLOAD_PROGRESS_URL", cls.download_progress_url
            ),
            gpu_inventory=read.flag("KIMIK3_GPU_INVENTORY", cls.gpu_inventory),
            workers=int(read.number("KIMIK3_WORKERS", cls.workers, 1, 256, 1)),
            coalesce_seconds=read.number("KIMIK3_COALESCE_SECONDS", cls.coalesce_seconds, 0, 60),
            retry_max_seconds=read.number(
                "KIMIK3_RETRY_MAX_SECONDS", cls.retry_max_seconds, 0.01, 86400
            ),
            pod_monitor_labels=read.labels("KIMIK3_PODMONITOR_LABELS"),
            kueue_admission_gate=read.flag("KIMIK3_KUEUE_ADMISSION_GATE", False),
            service_accounts=read.names("KIMIK3_SERVICE_ACCOUNTS"),
            prometheus_url=read.url(
                "KIMIK3_PROMETHEUS_URL", cls.prometheus_url, schemes=("http", "https")
            ),
            epp_image=read.image("KIMIK3_EPP_IMAGE", cls.epp_image),
            epp_cluster_role=read.name("KIMIK3_EPP_CLUSTER_ROLE", cls.epp_cluster_role),
            pd_picker_image=read.image("KIMIK3_PD_PICKER_IMAGE", cls.pd_picker_image),
            routing_sidecar_image=read.image(
                "KIMIK3_ROUTING_SIDECAR_IMAGE", cls.routing_sidecar_image
            ),
            lease_name=read.name("KIMIK3_LEASE_NAME", cls.lease_name),
            lease_namespace=lease_namespace,
            lease_seconds=read.number("KIMIK3_LEASE_SECONDS", cls.lease_seconds, 1, 3600),
            identity=env.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
        )


class SettingsError(ValueError):
    """A setting the operator cannot run with: names the variable, the value, what it takes."""

    def __init__(self, name: str, value: str, problem: str) -> None:
        self.name = name
        super().__init__(f"{name}={value!r}: {problem}")


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
IMAGE = re.compile(
    r"^[a-z0-9][a-z0-9._:/-]{0,255}(:[A-Za-z0-9_.-]{1,128})?(@sha256:[a-f0-9]{64})?$"
)
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False,
         "no": False, "off": False}  # fmt: skip


class _Reader:
    """Reads one kind of value each, raising SettingsError with the variable's name."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def _raw(self, name: str) -> str | None:
        value = self.env.get(name)
        return None if value is None or value.strip() == "" else value.strip()

    def number(self, name: str, default: float, low: float, high: float, step: int = 0) -> float:
        raw = self._raw(name)
        if raw is None:
            return default
        kind = "a whole number" if step else "a number"
        try:
            value = int(raw) if step else float(raw)
        except ValueError:
            raise SettingsError(name, raw, f"is not {kind} ({low:g} to {high:g})") from None
        if not low <= value <= high:  # NaN too
            raise SettingsError(name, raw, f"is out of range: {kind} from {low:g} to {high:g}")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        raw = self._raw(name)
        if raw is None:
            return default
        if raw.lower() not in FLAGS:
            raise SettingsError(name, raw, "is not true or false")
        return FLAGS[raw.lower()]

    def url(
        self, name: str, default: str, port: bool = False, schemes: tuple[str, ...] = ("http",)
    ) -> str:
        raw = self._raw(name)
        if raw is None:
            return default
        parsed = urllib.parse.urlsplit(raw.replace("{pod}", "p").replace("{namespace}", "n"))
        if parsed.scheme not in schemes or not parsed.hostname:
            kinds = " or ".join(f"{scheme}://" for scheme in schemes)
            raise SettingsError(name, raw, f"is not an {kinds} URL with a host")
        try:
            given = parsed.port
        except ValueError:
            raise SettingsError(name, raw, "has a port out of range (1 to 65535)") from None
        if port and not given:
            raise SettingsError(
                name, raw, "names no port to listen on (http://0.0.0.0:8080/healthz)"
            )
        return raw

    def address(self, name: str, default: str) -> str:
        raw = self._raw(name)
        if raw is None:
            return default
        try:
            ipaddress.ip_address(raw)
        except ValueError:
            raise SettingsError(
                name, raw, "is not an IP address (0.0.0.0 listens on all)"
            ) from None
        return raw

    def labels(self, name: str) -> tuple[tuple[str, str], ...]:
        raw = self._raw(name)
        if raw is None:
            return ()
        found: list[tuple[str, str]] = []
        for term in filter(None, (t.strip() for t in raw.split(","))):
            key, equals, value = term.partition("=")
            key, value = key.strip(), value.strip()
            if not equals or not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
                raise SettingsError(
                    name, raw, f"{term!r} is not a label (key=value, as Kubernetes spells them)"
                )
            found.append((key, value))
        return tuple(found)

    def image(self, name: str, default: str) -> str:
        """A container image reference: no spaces or control characters, at most 512."""
        raw = self._raw(name)
        if raw is None:
            return default
        if not IMAGE.match(raw):
            raise SettingsError(
                name, raw, "is not an image reference (registry/repository:tag or @sha256:...)"
            )
        return raw

    def name(self, name: str, default: str) -> str:
        raw = self._raw(name)
        if raw is None:
            return default
        if not DNS_SUBDOMAIN.match(raw):
            raise SettingsError(name, raw, "is not an object name (a DNS subdomain)")
        return raw

    def names(self, name: str) -> tuple[str, ...]:
        """A comma-separated list of object names (empty: none)."""
        raw = self._raw(name)
        found = tuple(n.strip() for n in (raw or "").split(",") if n.strip())
        for item in found:
            if not DNS_SUBDOMAIN.match(item):
                raise SettingsError(name, raw or "", f"{item!r} is not an object name")
        return found
