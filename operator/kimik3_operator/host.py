"""The kopf wiring: kopf hosts the process (start-up and clean-up, login, the health endpoint,
signals, logging); the manager does the work from its own watches, and with a Lease name
only while this replica holds the Lease. Importing registers the handlers."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import prometheus_client

from kimik3_operator.config import Settings
from kimik3_operator.controller.act import SIDE_BY_SIDE
from kimik3_operator.controller.reconcile import reconcile_for_runtime
from kimik3_operator.kube import ApiKube
from kimik3_operator.redact import install_log_redaction
from kimik3_operator.runtime.leader import LeaseElector
from kimik3_operator.runtime.manager import Manager
from kimik3_operator.runtime.readers import AcceptanceReader

log = logging.getLogger(__name__)
SETTINGS = Settings.from_env()
MANAGERS: list[Manager] = []
ELECTORS: list[LeaseElector] = []


@kopf.on.startup()
def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    install_log_redaction()
    logging.getLogger("aiohttp.server").addFilter(NotReadyLine())
    log.info(
        "starting: %d reconcile workers, watching %s",
        SETTINGS.workers,
        ", ".join(SETTINGS.namespaces) or "every namespace",
    )
    if SETTINGS.metrics_port:
        prometheus_client.start_http_server(SETTINGS.metrics_port, SETTINGS.metrics_address)
    # Each worker's independent writes go at once; the leader, readers and lists beside them.
    api = ApiKube.from_environment(connections=SETTINGS.workers * len(SIDE_BY_SIDE) + 8)
    settings.posting.enabled = False  # events are posted by the reconcile, on change only
    settings.watching.server_timeout = 300
    # Namespaces are listed explicitly (or all): kopf need not list/watch namespaces and
    # CRDs, which keeps the RBAC to what the operator itself uses.
    settings.scanning.disabled = True
    acceptance = AcceptanceReader(
        window_seconds=SETTINGS.acceptance_window_seconds, url_override=SETTINGS.scrape_url
    )
    manager = Manager(api, api.api_client, SETTINGS, acceptance, reconcile_for_runtime)
    if SETTINGS.lease_name:
        elector = LeaseElector(
            api,
            SETTINGS.lease_name,
            SETTINGS.lease_namespace,
            SETTINGS.identity,
            on_started=lambda: manager.set_active(True),
            on_stopped=lambda: manager.set_active(False),
            lease_seconds=SETTINGS.lease_seconds,
            renew_deadline_seconds=SETTINGS.lease_seconds * 2 / 3,
            retry_seconds=min(1.5, SETTINGS.lease_seconds / 4),
        )
        # No write once leadership is lost, even from a reconcile already running.
        manager.kube.may_write = elector.leading.is_set
        ELECTORS.append(elector)
        elector.start()
    else:
        manager.set_active(True)
    manager.start()
    MANAGERS.append(manager)


NOT_READY = "the watches have not all listed yet"


@kopf.on.probe(id="informers")
def informers_synced(**_: Any) -> str:
    """The health endpoint fails (500) until every watch has listed and the workers run."""
    if not MANAGERS or not all(c.ready.is_set() for c in MANAGERS):
        raise kopf.PermanentError(NOT_READY)
    return "synced"


class NotReadyLine(logging.Filter):
    """The web server logs a failed health check with two tracebacks; not being ready yet
    is expected at start-up, so it says so in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        cause = getattr(error, "__cause__", None)
        if cause is not None and NOT_READY in str(cause):
            record.msg, record.args = f"health check: not ready: {NOT_READY}", None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


@kopf.on.cleanup()
def stop(**_: Any) -> None:
    # On SIGTERM: the Lease goes to the next replica at once, not after it expires.
    while ELECTORS:
        ELECTORS.pop().release()
    while MANAGERS:
        MANAGERS.pop().stop()
