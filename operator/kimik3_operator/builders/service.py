"""The Service in front of the leaders: workers run headless, without HTTP."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner, metadata, selector_labels
from kimik3_operator.builders.leaderworkerset import PORT_NAME


def build_service(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            **metadata(owner, names.service(owner.name), c.COMPONENT_LEADER),
            **({"annotations": dict(spec.service.annotations)} if spec.service.annotations else {}),
        },
        "spec": {
            "type": spec.service.type,
            # A disaggregated deployment answers from its decode side; a P/D router sends
            # the prompt to a prefill group first.
            "selector": {
                **selector_labels(owner, c.COMPONENT_LEADER),
                **({c.LABEL_ROLE: "decode"} if spec.disaggregated else {}),
            },
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": spec.service.port,
                    # A decode leader's routing sidecar, in front of its engine.
                    "targetPort": c.SIDECAR_PORT_NAME if spec.disaggregated else PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }
