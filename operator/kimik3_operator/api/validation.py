"""Rules that make a spec unreadable, checked at parse time (InvalidSpec).

The CRD states them too (ranges, CEL), so the API server rejects them at ``kubectl apply``;
the operator checks them again for resources stored before the schema had them. Rules about
whether a readable spec can run (GPUs filling nodes, the draft tensor size, ...) are the
preflight's, so they carry a finding and a stable reason.
"""

from __future__ import annotations

from kimik3_operator.api.spec import KimiK3DeploymentSpec, SpecError


def errors(spec: KimiK3DeploymentSpec) -> list[SpecError]:
    found: list[SpecError] = []
    par, place, drafter = spec.parallelism, spec.placement, spec.drafter
    if spec.replicas < 0:
        found.append(SpecError("spec.replicas", spec.replicas, "must not be negative"))
    for name, value in (
        ("tensor", par.tensor),
        ("pipeline", par.pipeline),
        ("decodeContext", par.decode_context),
    ):
        if value < 1:
            found.append(SpecError(f"spec.parallelism.{name}", value, "must be at least 1"))
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
    return found


def first_error(spec: KimiK3DeploymentSpec) -> SpecError | None:
    found = errors(spec)
    return found[0] if found else None
