"""spec.routing's children: the InferencePool of the routable leaders, its endpoint picker
(EPP: config, Deployment, Service, ServiceAccount and a RoleBinding to the chart's
ClusterRole for it) and, when a Gateway is named, the HTTPRoute from it.

Which leaders are routable is the operator's label on each pod (``LABEL_ROUTABLE``), part
of the pool's selector: the EPP itself runs unchanged, as its project ships it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import (
    Owner,
    job_placement,
    labels,
    metadata,
    selector_labels,
)

GRPC_PORT: Final = 9002
HEALTH_PORT: Final = 9003
METRICS_PORT: Final = 9090
CONFIG_MOUNT: Final = "/config"
CONFIG_KEY: Final = "config.yaml"
# The EPP's user in its image is nonroot (65532); named so runAsNonRoot can be checked.
EPP_USER: Final = 65532


@dataclass(frozen=True)
class PickerSettings:
    """The operator's settings for the endpoint pickers it makes."""

    image: str = c.DEFAULT_EPP_IMAGE
    # The ClusterRole the chart ships with what an EPP reads; bound in each namespace.
    cluster_role: str = c.DEFAULT_EPP_CLUSTER_ROLE
    # A disaggregated deployment's: llm-d's router, with its P/D profiles, and the routing
    # sidecar in front of each decode leader.
    pd_image: str = c.DEFAULT_PD_PICKER_IMAGE
    sidecar_image: str = c.DEFAULT_ROUTING_SIDECAR_IMAGE


def routable_selector(owner: Owner) -> dict[str, str]:
    """The pool's selector: this deployment's leaders (only they serve HTTP in a group)
    that carry the operator's routable label."""
    return {
        **selector_labels(owner, c.COMPONENT_LEADER),
        c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
        c.LABEL_ROUTABLE: "true",
    }


def picker_config() -> str:
    """The EndpointPickerConfig: queue depth, KV-cache use and prefix affinity, weighted as
    the Inference Extension's own chart does, over vLLM's metric names."""
    config = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "prefix-cache-scorer"},
            {
                "type": "metrics-data-source",
                "parameters": {"scheme": "http", "path": "/metrics"},
            },
            {"type": "core-metrics-extractor"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "queue-scorer", "weight": 2},
                    {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                    {"pluginRef": "prefix-cache-scorer", "weight": 3},
                ],
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def pd_picker_config() -> str:
    """llm-d's router for a prefill/decode pair: every request is disaggregated (the
    deployment asked for it), the prefill leader picked by its queued prompt tokens among the
    ``llm-d.ai/role: prefill`` leaders, the decode leader by its requests in flight among the
    decode ones (the profiles of llm-d's own P/D guide, without its prefix-affinity gate,
    whose threshold is measured per fleet)."""
    config = {
        "apiVersion": "llm-d.ai/v1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "always-disagg-pd-decider"},
            {
                "type": "disagg-profile-handler",
                "parameters": {"deciders": {"prefill": "always-disagg-pd-decider"}},
            },
            {"type": "prefill-filter"},
            {"type": "decode-filter"},
            {"type": "inflight-load-producer"},
            {"type": "token-load-scorer"},
            {"type": "active-request-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "prefill",
                "plugins": [
                    {"pluginRef": "prefill-filter"},
                    {"pluginRef": "token-load-scorer"},
                    {"pluginRef": "max-score-picker"},
                ],
            },
            {
                "name": "decode",
                "plugins": [
                    {"pluginRef": "decode-filter"},
                    {"pluginRef": "active-request-scorer"},
                    {"pluginRef": "max-score-picker"},
                ],
            },
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def picker_args(owner: Owner) -> list[str]:
    """The EPP's flags (v1.5.0), named in full so an image's defaults cannot differ."""
    return [
        f"--pool-name={names.inference_pool(owner.name)}",
        f"--pool-namespace={owner.namespace}",
        f"--config-file={CONFIG_MOUNT}/{CONFIG_KEY}",
        f"--grpc-port={GRPC_PORT}",
        f"--grpc-health-port={HEALTH_PORT}",
        f"--metrics-port={METRICS_PORT}",
        # Its metrics, like vLLM's, are read without a token: checking one needs cluster-wide
        # TokenReviews, which a RoleBinding in the namespace cannot grant.
        "--metrics-endpoint-auth=false",
    ]


def build_inference_pool(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any]:
    assert spec.routing is not None
    return {
        "apiVersion": f"{c.INFERENCE_GROUP}/{c.INFERENCE_VERSION}",
        "kind": "InferencePool",
        "metadata": metadata(owner, names.inference_pool(owner.name), c.COMPONENT_LEADER),
        "spec": {
            "selector": {"matchLabels": routable_selector(owner)},
            "targetPorts": [{"number": spec.service.port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": names.endpoint_picker(owner.name),
                "port": {"number": GRPC_PORT},
                "failureMode": spec.routing.failure_mode,
            },
        },
    }


def build_picker_config_map(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any]:
    config = pd_picker_config() if spec.disaggregated else picker_config()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, names.endpoint_picker(owner.name), c.COMPONENT_EPP),
        "data": {CONFIG_KEY: config},
    }


def build_picker_service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(owner, names.endpoint_picker(owner.name), c.COMPONENT_EPP),
        # Mounted into the EPP's pod only, which reads pods and pools from the API server.
        "automountServiceAccountToken": False,
    }


def build_picker_role_binding(owner: Owner, settings: PickerSettings) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(owner, names.endpoint_picker(owner.name), c.COMPONENT_EPP),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": settings.cluster_role,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": names.endpoint_picker(owner.name),
                "namespace": owner.namespace,
            }
        ],
    }


def build_picker_deployment(
    spec: KimiK3DeploymentSpec, owner: Owner, settings: PickerSettings
) -> dict[str, Any]:
    name = names.endpoint_picker(owner.name)
    container = {
        "name": "epp",
        "image": settings.pd_image if spec.disaggregated else settings.image,
        "imagePullPolicy": "IfNotPresent",
        "args": picker_args(owner),
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {
            "grpc": {"port": HEALTH_PORT, "service": "inference-extension"},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
        },
        "readinessProbe": {
            "grpc": {"port": HEALTH_PORT, "service": "inference-extension"},
            "periodSeconds": 2,
        },
        "resources": {
            "requests": {"cpu": "500m", "memory": "512Mi"},
            "limits": {"memory": "2Gi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_labels = labels(owner, c.COMPONENT_EPP)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, c.COMPONENT_EPP),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(owner, c.COMPONENT_EPP)},
            # A new picker is Ready before the old one goes: with failureMode FailClose, a
            # gateway without a picker refuses every request.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": True,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": EPP_USER,
                        "runAsGroup": EPP_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": name}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                    ],
                    **job_placement(spec),
                },
            },
        },
    }


def build_picker_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, names.endpoint_picker(owner.name), c.COMPONENT_EPP),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner, c.COMPONENT_EPP),
            "ports": [
                {
                    "name": "grpc-ext-proc",
                    "port": GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "http2",
                },
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


def build_picker_pod_monitor(owner: Owner, labels: Mapping[str, str]) -> dict[str, Any]:
    """The picker's own metrics (inference_pool_*, inference_extension_*), scraped like the
    leaders', for the serving dashboard."""
    meta = metadata(owner, names.endpoint_picker(owner.name), c.COMPONENT_EPP)
    meta["labels"] = {**labels, **meta["labels"]}
    return {
        "apiVersion": f"{c.MONITORING_GROUP}/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector_labels(owner, c.COMPONENT_EPP)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
            "podTargetLabels": [c.LABEL_INSTANCE],
        },
    }


def build_http_route(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any] | None:
    gateway = spec.routing.gateway if spec.routing is not None else None
    if gateway is None:
        return None
    parent: dict[str, Any] = {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "name": gateway.name,
    }
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    return {
        "apiVersion": f"{c.GATEWAY_GROUP}/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(owner, names.http_route(owner.name), c.COMPONENT_LEADER),
        "spec": {
            "parentRefs": [parent],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [
                        {
                            "group": c.INFERENCE_GROUP,
                            "kind": "InferencePool",
                            "name": names.inference_pool(owner.name),
                        }
                    ],
                }
            ],
        },
    }


def routing_children(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    settings: PickerSettings,
    gateway_api: bool,
    pod_monitor_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every child of spec.routing, in the order they are applied (the picker's account,
    binding and config before its pods; the pool last but one, the route last)."""
    if spec.routing is None:
        return []
    found = [
        build_picker_service_account(owner),
        build_picker_role_binding(owner, settings),
        build_picker_config_map(spec, owner),
        build_picker_deployment(spec, owner, settings),
        build_picker_service(owner),
        build_inference_pool(spec, owner),
    ]
    if pod_monitor_labels is not None:
        # None: no PodMonitor CRD, or the spec asks for none (monitoring.podMonitor).
        found.append(build_picker_pod_monitor(owner, pod_monitor_labels))
    route = build_http_route(spec, owner) if gateway_api else None
    return [*found, *([route] if route is not None else [])]
