"""The typed, defaulted spec of a KimiK3Deployment, with the sizes derived from it and its
paired drafter (resolved once per parse; ``api/parse.py`` makes it from the resource)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

from kimik3_operator.api import constants as c
from kimik3_operator.api.pairing import ResolvedDrafter, resolve_drafter
from kimik3_operator.api.types import (
    AutoscalingSpec,
    DisaggregatedRole,
    DisaggregationSpec,
    DrafterSpec,
    EngineSpec,
    ModelSpec,
    MonitoringSpec,
    ParallelismSpec,
    PlacementSpec,
    PreflightSpec,
    ResourcesSpec,
    RolloutSpec,
    RoutingSpec,
    SchedulingSpec,
    SecuritySpec,
    ServiceSpec,
    ServingPodSpec,
)


@dataclass(frozen=True)
class KimiK3DeploymentSpec:
    replicas: int = 1
    model: ModelSpec = field(default_factory=ModelSpec)
    drafter: DrafterSpec = field(default_factory=DrafterSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    autoscaling: AutoscalingSpec | None = None
    routing: RoutingSpec | None = None
    disaggregation: DisaggregationSpec | None = None
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    service: ServiceSpec = field(default_factory=ServiceSpec)
    pod: ServingPodSpec = field(default_factory=ServingPodSpec)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    preflight: PreflightSpec = field(default_factory=PreflightSpec)
    monitoring: MonitoringSpec = field(default_factory=MonitoringSpec)
    security_context: SecuritySpec = field(default_factory=SecuritySpec)

    @property
    def runs_as_non_root(self) -> bool:
        """The serving pods' runAsNonRoot, after its default."""
        explicit = self.security_context.run_as_non_root
        if explicit is not None:
            return explicit
        return not self.engine.add_capabilities

    @property
    def gpus_per_replica(self) -> int:
        par = self.parallelism
        return par.tensor * par.pipeline * par.data

    @property
    def nodes_per_replica(self) -> int:
        """Pods (one per node) in a group; 1 when the group fits one node."""
        per_node = self.placement.gpus_per_node
        return max(1, -(-self.gpus_per_replica // per_node))

    @property
    def gpus_per_pod(self) -> int:
        return min(self.gpus_per_replica, self.placement.gpus_per_node)

    @property
    def served_model_name(self) -> str:
        return self.model.served_name or self.model.repo

    @property
    def queued(self) -> bool:
        """Whether Kueue admits the groups (spec.scheduling.queueName)."""
        return bool(self.scheduling.queue_name)

    @property
    def autoscaled(self) -> bool:
        """Whether KEDA drives spec.replicas (spec.autoscaling)."""
        return self.autoscaling is not None

    @property
    def routed(self) -> bool:
        """Whether an endpoint picker routes the requests (spec.routing)."""
        return self.routing is not None

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode run in groups of their own (spec.disaggregation)."""
        return self.disaggregation is not None

    def role_spec(self, role: DisaggregatedRole) -> KimiK3DeploymentSpec:
        """The spec one side of the pair is built from: its groups, parallelism, resources
        and engine arguments in place of the deployment's; the rest is the deployment's."""
        disaggregation = self.disaggregation
        if disaggregation is None:
            return self
        side = disaggregation.role(role)
        engine = dataclasses.replace(
            self.engine, extra_args=(*self.engine.extra_args, *side.extra_args)
        )
        # The decode engine serves behind the routing sidecar, which takes the service port.
        service = (
            dataclasses.replace(self.service, port=decode_engine_port(self.service.port))
            if role == "decode"
            else self.service
        )
        return dataclasses.replace(
            self,
            replicas=side.replicas,
            parallelism=side.parallelism or self.parallelism,
            resources=side.resources or self.resources,
            engine=engine,
            service=service,
        )

    @property
    def speculative(self) -> bool:
        return self.drafter.method != "none"

    @cached_property
    def paired_drafter(self) -> ResolvedDrafter | None:
        """The drafter this deployment runs, after pairing (None: ``method: none``). The
        preflight, the builders and the status all read this one answer."""
        return resolve_drafter(self.model.repo, self.drafter)


def decode_engine_port(service_port: int) -> int:
    """Where a decode leader's engine listens: behind the routing sidecar on the service
    port, so never on it."""
    port = c.DECODE_ENGINE_PORT
    return port if service_port != port else port + 1
