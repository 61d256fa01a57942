"""The kopf wiring: every trigger calls the same reconcile. Importing registers them."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import prometheus_client

from kimik3_operator import metrics
from kimik3_operator.api import constants as c
from kimik3_operator.config import Settings
from kimik3_operator.handlers.reconcile import reconcile
from kimik3_operator.handlers.speculation import Scraper
from kimik3_operator.kube import ApiKube, Kube, KubeError

SETTINGS = Settings.from_env()
_kube: Kube | None = None
MANAGED = {c.LABEL_MANAGED_BY: c.OPERATOR_NAME}
SCRAPER = Scraper(
    window_seconds=SETTINGS.acceptance_window_seconds, url_override=SETTINGS.scrape_url
)


def ensure_peering(client: Kube, name: str, namespaces: tuple[str, ...]) -> None:
    """kopf's peering object must exist before the replicas can see each other."""
    where: tuple[str | None, ...] = namespaces or (None,)
    for namespace in where:
        kind = "KopfPeering" if namespace else "ClusterKopfPeering"
        if client.get("kopf.dev/v1", kind, name, namespace) is None:
            meta: dict[str, Any] = {"name": name}
            if namespace:
                meta["namespace"] = namespace
            try:
                client.create({"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": meta})
            except KubeError as exc:
                if exc.status != 409:  # another replica made it first
                    raise


def kube() -> Kube:
    global _kube  # noqa: PLW0603 - one client for the process, made after kopf logs in
    if _kube is None:
        _kube = ApiKube.from_environment()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    if SETTINGS.metrics_port:
        prometheus_client.start_http_server(SETTINGS.metrics_port, SETTINGS.metrics_address)
    settings.peering.priority = SETTINGS.priority
    settings.peering.lifetime = SETTINGS.peering_lifetime_seconds
    if SETTINGS.peering_name:
        ensure_peering(kube(), SETTINGS.peering_name, SETTINGS.namespaces)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # events are posted by the reconcile, on change only
    settings.watching.server_timeout = 300
    settings.execution.max_workers = 8
    # Namespaces are listed explicitly (or all): no need to list/watch namespaces and CRDs,
    # which keeps the RBAC to what the operator itself uses.
    settings.scanning.disabled = True


@kopf.on.create(c.GROUP, c.VERSION, c.PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, field="spec")
@kopf.on.resume(c.GROUP, c.VERSION, c.PLURAL)
def on_change(body: kopf.Body, **_: Any) -> None:
    result = reconcile(kube(), body)
    if result.invalid:
        raise kopf.PermanentError("the spec is invalid; see the Degraded condition")


@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=SETTINGS.resync_seconds, idle=0)
def resync(body: kopf.Body, **_: Any) -> None:
    reconcile(kube(), body)


Logger = logging.Logger | logging.LoggerAdapter[Any]


@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=SETTINGS.scrape_seconds, idle=0)
def scrape_acceptance(body: kopf.Body, **_: Any) -> None:
    SCRAPER.tick(kube(), body)


def _reconcile_owner(namespace: str | None, labels: Any, logger: Logger) -> None:
    name = (labels or {}).get(c.LABEL_INSTANCE)
    if not name or not namespace:
        return
    try:
        # reconcile() reads the stored object itself and skips one gone or being deleted.
        reconcile(kube(), {"metadata": {"name": name, "namespace": namespace}})
    except Exception as exc:  # the timer retries; a child event must never crash the watch
        logger.warning("reconcile of %s/%s after a child event failed: %s", namespace, name, exc)


@kopf.on.delete(c.GROUP, c.VERSION, c.PLURAL, optional=True)
def on_delete(namespace: str | None, name: str | None, **_: Any) -> None:
    """Children go by garbage collection; only the metrics series are the operator's."""
    if namespace and name:
        metrics.forget(namespace, name)
        SCRAPER.forget(namespace, name)


@kopf.on.event("v1", "pods", labels=MANAGED)
@kopf.on.event(c.LWS_GROUP, c.LWS_VERSION, c.LWS_PLURAL, labels=MANAGED)
def on_child_event(namespace: str | None, labels: Any, type: str, logger: Logger, **_: Any) -> None:
    if not type:  # the initial listing: the resume handlers cover it
        return
    _reconcile_owner(namespace, labels, logger)
