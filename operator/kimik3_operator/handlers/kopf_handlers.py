"""The kopf wiring: kopf runs the process (peering, liveness, signals); the controller does
the work from its own watches. Importing registers the handlers."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import prometheus_client

from kimik3_operator.api import constants as c
from kimik3_operator.config import Settings
from kimik3_operator.handlers.controller import Controller
from kimik3_operator.handlers.speculation import Scraper
from kimik3_operator.kube import ApiKube, Kube, KubeError
from kimik3_operator.redact import install_log_redaction

SETTINGS = Settings.from_env()
CONTROLLERS: list[Controller] = []


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


class PeeringFollower(logging.Handler):
    """Follows kopf's peering verdicts, which kopf only logs: the controller works while
    this replica is the active one and keeps its caches warm while it is not."""

    def __init__(self, controller: Controller) -> None:
        super().__init__(logging.INFO)
        self.controller = controller

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Pausing operations") or message.startswith("Pausing all"):
            self.controller.set_active(False)
        elif message.startswith("Resuming operations"):
            self.controller.set_active(True)


@kopf.on.startup()
def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    install_log_redaction()
    if SETTINGS.metrics_port:
        prometheus_client.start_http_server(SETTINGS.metrics_port, SETTINGS.metrics_address)
    settings.peering.priority = SETTINGS.priority
    settings.peering.lifetime = SETTINGS.peering_lifetime_seconds
    api = ApiKube.from_environment()
    if SETTINGS.peering_name:
        ensure_peering(api, SETTINGS.peering_name, SETTINGS.namespaces)
    settings.posting.enabled = False  # events are posted by the reconcile, on change only
    settings.watching.server_timeout = 300
    # Namespaces are listed explicitly (or all): kopf need not list/watch namespaces and
    # CRDs, which keeps the RBAC to what the operator itself uses.
    settings.scanning.disabled = True
    scraper = Scraper(
        window_seconds=SETTINGS.acceptance_window_seconds, url_override=SETTINGS.scrape_url
    )
    controller = Controller(api, api.api_client, SETTINGS, scraper)
    if SETTINGS.peering_name:
        logging.getLogger("kopf").addHandler(PeeringFollower(controller))
    else:
        controller.set_active(True)
    controller.start()
    CONTROLLERS.append(controller)


@kopf.on.probe(id="caches")
def caches_synced(**_: Any) -> str:
    """The health endpoint fails until every watch has listed and the workers run."""
    if not CONTROLLERS or not all(c.ready.is_set() for c in CONTROLLERS):
        raise kopf.PermanentError("the watch caches have not all listed yet")
    return "synced"


@kopf.on.cleanup()
def stop(**_: Any) -> None:
    while CONTROLLERS:
        CONTROLLERS.pop().stop()


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
def served(**_: Any) -> None:
    """kopf serves the resource so that its peering elects one active replica; the
    controller's watches do the work. An event handler needs no finalizer."""
