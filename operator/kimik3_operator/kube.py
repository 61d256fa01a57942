"""A small JSON-in, JSON-out Kubernetes client over the official ``kubernetes`` package.

Objects stay plain dicts in their API (camelCase) form, the same shape the builders make.
Every write goes through ``apply``, ``patch_status``, ``delete`` or ``create``, so tests can
count them.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from kimik3_operator.api.constants import FIELD_MANAGER
from kimik3_operator.api.kinds import KINDS

log = logging.getLogger(__name__)
Obj = dict[str, Any]
USER_AGENT = "kimik3-operator"
# A request at least this slow is logged (INFO): the first place to look for a slow reconcile.
SLOW_REQUEST_SECONDS = 1.0


class KubeError(Exception):
    def __init__(self, status: int, reason: str, body: str) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        message = body
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(body).get("message", body)
        super().__init__(f"{status} {reason}: {message}")


class Kube(Protocol):
    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None: ...

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]: ...

    def get_from_server(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        """From the API server itself: the watch store holds only what the operator labels,
        so an object of someone else's with a child's name is invisible to ``get``."""
        ...

    def list_from_server(
        self, api_version: str, kind: str, namespace: str, label_selector: str, limit: int
    ) -> builtins.list[Obj]:
        """At most ``limit`` objects, from the API server: for kinds the operator does not
        watch (Kueue's Workloads), read only for the resources that need them."""
        ...

    def apply(self, manifest: Mapping[str, Any], force: bool = True) -> Obj: ...

    def patch_status(
        self, api_version: str, kind: str, name: str, namespace: str, status: Mapping[str, Any]
    ) -> Obj: ...

    def patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: Mapping[str, Any]
    ) -> Obj: ...

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> None: ...

    def create(self, manifest: Mapping[str, Any]) -> Obj: ...


def resource_path(api_version: str, kind: str, namespace: str | None, name: str = "") -> str:
    return KINDS[kind].path(namespace, name, api_version)


def send(
    api_client: Any,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: Any = 30,
) -> Any:
    """One request to the API server through the official client's connection pool and
    credentials; the raw response (the informer streams a watch from it)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    params = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    return api_client.call_api(*params, _request_timeout=timeout)


class ApiKube:
    """The real client: JSON over the API server's REST paths."""

    def __init__(self, api_client: Any) -> None:
        self._client = api_client

    @classmethod
    def from_environment(cls, connections: int = 0) -> ApiKube:
        """A client from the pod's ServiceAccount, else the kubeconfig. ``connections``: the
        idle connections kept for reuse (the client's default is 5 per CPU), as many as the
        operator's requests may be at once: beyond it each request opens and drops a TLS
        connection, which costs the API server most when it is busiest."""
        import kubernetes

        try:
            kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
        configuration = kubernetes.client.Configuration.get_default_copy()
        if connections:
            configuration.connection_pool_maxsize = connections
        client = kubernetes.client.ApiClient(configuration)
        client.user_agent = USER_AGENT
        return cls(client)

    @property
    def api_client(self) -> Any:
        return self._client

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        started = time.monotonic()
        response = send(
            self._client, method, path, query=query, body=body, content_type=content_type
        )
        data = response.read()
        took = time.monotonic() - started
        if took >= SLOW_REQUEST_SECONDS:
            # Where a slow reconcile waited: the path names no secret, the body is not logged.
            log.info("API %s %s took %.2fs (HTTP %d)", method, path, took, response.status)
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if response.status >= 400:
            raise KubeError(response.status, str(response.reason), text)
        return json.loads(text) if text else None

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        try:
            result: Obj = self._call("GET", resource_path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def get_from_server(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        return self.get(api_version, kind, name, namespace)

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]:
        query = []
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        result = self._call("GET", resource_path(api_version, kind, namespace), query=query)
        items: list[Obj] = result.get("items", []) or []
        return items

    def list_from_server(
        self, api_version: str, kind: str, namespace: str, label_selector: str, limit: int
    ) -> builtins.list[Obj]:
        query = [("labelSelector", label_selector), ("limit", str(limit))]
        result = self._call("GET", resource_path(api_version, kind, namespace), query=query)
        items: list[Obj] = (result.get("items", []) or [])[:limit]
        return items

    def apply(self, manifest: Mapping[str, Any], force: bool = True) -> Obj:
        meta = manifest["metadata"]
        path = resource_path(
            manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"]
        )
        result: Obj = self._call(
            "PATCH",
            path,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true" if force else "false")],
            body=dict(manifest),
            content_type="application/apply-patch+yaml",
        )
        return result

    def patch_status(
        self, api_version: str, kind: str, name: str, namespace: str, status: Mapping[str, Any]
    ) -> Obj:
        path = resource_path(api_version, kind, namespace, name) + "/status"
        result: Obj = self._call(
            "PATCH",
            path,
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
        )
        return result

    def patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: Mapping[str, Any]
    ) -> Obj:
        result: Obj = self._call(
            "PATCH",
            resource_path(api_version, kind, namespace, name),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
        return result

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        try:
            self._call(
                "DELETE",
                resource_path(api_version, kind, namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    def create(self, manifest: Mapping[str, Any]) -> Obj:
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"))
        result: Obj = self._call("POST", path, body=dict(manifest))
        return result


def namespace_labels_from_server(kube: Kube, namespace: str) -> Mapping[str, str] | None:
    """The namespace's labels (None: it cannot be read, so no prediction is made)."""
    try:
        found = kube.get_from_server("v1", "Namespace", namespace)
    except KubeError as err:
        log.warning("namespace %s cannot be read (%s): Pod Security not predicted", namespace, err)
        return None
    if found is None:
        return None
    labels = (found.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}
