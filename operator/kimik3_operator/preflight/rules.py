"""The preflight rules: pure functions from the typed spec, the capability table and (when
known) the checkpoints' configs to findings. Each finding names the field, the value and
the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kimik3_operator.api.constants import KV_CONNECTOR_CLASSES, ConditionType, Reason
from kimik3_operator.api.flags import flag_name, owned_flag, serve_flag_problem
from kimik3_operator.api.pairing import (
    KNOWN_DRAFTER_CONFIGS,
    TARGET_MODEL_TYPE,
    ResolvedDrafter,
)
from kimik3_operator.api.schema_check import nearest
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import (
    CHECKPOINT_METHODS,
    DISAGGREGATED_ROLES,
    EAGLE3_FAMILY,
    GQA_ARCHITECTURES,
    TARGET_ARCHITECTURES,
)
from kimik3_operator.preflight.drafter_methods import judge, methods_that_load
from kimik3_operator.preflight.facts import DrafterFacts, TargetFacts
from kimik3_operator.preflight.table import (
    CapabilityTable,
    Version,
    format_version,
    resolve_version,
)

FindingStatus = Literal["Pass", "Fail", "Unknown"]
CAPABILITIES = ConditionType.CAPABILITIES_VERIFIED
DRAFTER = ConditionType.DRAFTER_PAIRED
DRAFTER_ARCHITECTURE = {"dspark": "K3DSparkModel", "mtp": "KimiK3MTPModel"}


@dataclass(frozen=True)
class Finding:
    id: str
    status: FindingStatus
    reason: Reason
    message: str
    condition: str = CAPABILITIES

    def as_dict(self) -> dict[str, str]:
        return {
            "id": self.id,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True)
class Facts:
    """Everything the rules may consult besides the spec."""

    table: CapabilityTable
    target: TargetFacts = field(default_factory=TargetFacts)
    drafter: DrafterFacts | None = None
    # Answers of the image probe, per architecture, replacing the table's for that image.
    probed: dict[str, dict[str, Any]] | None = None
    probed_release: dict[str, Any] | None = None


@dataclass(frozen=True)
class Context:
    spec: KimiK3DeploymentSpec
    facts: Facts
    version: Version | None
    version_source: str

    @property
    def platform(self) -> str:
        return self.spec.engine.platform

    @property
    def architecture(self) -> str:
        """The class vLLM will instantiate: the one the checkpoint's config.json declares,
        where the probe read it; else the spec's."""
        declared = self.facts.target.architectures
        if self.facts.probed is not None and declared:
            return declared[0]
        return self.spec.model.architecture

    def target_caps(self) -> dict[str, Any] | None:
        return self.caps_of(self.architecture)

    def caps_of(self, architecture: str) -> dict[str, Any] | None:
        if self.facts.probed is not None:
            return self.facts.probed.get(architecture)
        if self.version is None:
            return None
        return self.facts.table.target(self.version, architecture, self.platform)

    def release(self) -> dict[str, Any] | None:
        if self.facts.probed_release is not None:
            return self.facts.probed_release
        return self.facts.table.release(self.version) if self.version else None

    def known(self) -> bool:
        return self.facts.probed is not None or (
            self.version is not None and self.facts.table.release(self.version) is not None
        )


Rule = Callable[[Context], Iterable[Finding]]


def _image_fix(version: Version | None) -> str:
    if version is None:
        return "set engine.image to a tagged release"
    return f"use engine.image vllm/vllm-openai:v{format_version(version)} or newer"


def check_version(ctx: Context) -> Iterable[Finding]:
    table, image = ctx.facts.table, ctx.spec.engine.image
    if ctx.facts.probed is not None:
        yield Finding(
            "vllm-version", "Pass", Reason.VERSION_PROBED, f"the image probe answered for {image}"
        )
        return
    if ctx.version is None:
        yield Finding(
            "vllm-version",
            "Unknown",
            Reason.VERSION_UNKNOWN,
            (
                f"spec.engine.image={image!r}: the vLLM release cannot be told "
                f"({ctx.version_source}); set spec.engine.version, or let the image probe "
                "(spec.preflight.probe) ask vLLM"
            ),
        )
        return
    shown = format_version(ctx.version)
    if ctx.version < table.first_release:
        yield Finding(
            "vllm-version",
            "Fail",
            Reason.VLLM_TOO_OLD,
            (
                f"vLLM {shown} ({ctx.version_source} of spec.engine.image={image!r}) predates "
                f"{format_version(table.first_release)}, the first release that serves Kimi-K3 "
                "(0.26 registers KimiLinearForCausalLM for the older Kimi-Linear model); "
                + _image_fix(table.first_release)
            ),
        )
        return
    if table.release(ctx.version) is None:
        newest = format_version(table.releases[-1])
        yield Finding(
            "vllm-version",
            "Unknown",
            Reason.VERSION_NOT_IN_TABLE,
            (
                f"vLLM {shown} ({ctx.version_source}) is not in the capability table (known: "
                f"{format_version(table.first_release)} to {newest}); the image probe "
                "(spec.preflight.probe) must answer for it"
            ),
        )
        return
    yield Finding(
        "vllm-version",
        "Pass",
        Reason.VERSION_KNOWN,
        f"vLLM {shown} ({ctx.version_source}) is in the capability table",
    )


def check_architecture(ctx: Context) -> Iterable[Finding]:
    declared = ctx.spec.model.architecture
    if ctx.facts.probed is None and not _table_judges(ctx, declared):
        # The table judges the Kimi classes; any other class is the image's to answer.
        near = nearest(declared, TARGET_ARCHITECTURES)
        yield Finding(
            "architecture",
            "Unknown",
            Reason.ARCHITECTURE_NEEDS_PROBE,
            (
                f"spec.model.architecture={declared!r} is not a Kimi-K3 class, which the "
                "capability table judges; the image probe (spec.preflight.probe) must ask the "
                "image's own model registry and interfaces"
                + (f" (did you mean {near}?)" if near else "")
            ),
        )
        return
    if not ctx.known():
        return
    caps = ctx.caps_of(declared)
    if caps is not None and caps.get("registered") is None:
        serves = (
            "serves Kimi-K3"
            if declared in TARGET_ARCHITECTURES
            else f"is registered in {_release_name(ctx)}"
        )
        yield Finding(
            "architecture",
            "Pass",
            Reason.ARCHITECTURE_REGISTERED,
            f"{declared} {serves} on {ctx.platform}",
        )
        return
    if caps is not None and caps.get("registered") is True and declared not in TARGET_ARCHITECTURES:
        yield Finding(
            "architecture",
            "Pass",
            Reason.ARCHITECTURE_REGISTERED,
            f"{declared} is registered in {_release_name(ctx)}",
        )
        return
    table = ctx.facts.table
    first = table.first_release_where(lambda v: table.target(v, declared, ctx.platform) is not None)
    fix = (
        f"{_image_fix(first)}, or choose another spec.model.architecture"
        if first
        else "choose another spec.model.architecture"
    )
    yield Finding(
        "architecture",
        "Fail",
        Reason.ARCHITECTURE_NOT_REGISTERED,
        (
            f"spec.model.architecture={declared!r} is not registered for Kimi-K3 on "
            f"{ctx.platform} in {_release_name(ctx)}; {fix}"
        ),
    )


def _table_judges(ctx: Context, architecture: str) -> bool:
    """The Kimi classes always; a GQA class once its config.json is given (its shape is
    not Kimi-K3's, and the rules judge nothing of it without)."""
    return architecture in TARGET_ARCHITECTURES or (
        architecture in GQA_ARCHITECTURES and _target_config_known(ctx)
    )


def _target_config_known(ctx: Context) -> bool:
    """Whether the target's config.json is at hand (the spec's, the CLI's or the probe's),
    not Kimi-K3's published shape standing in."""
    return ctx.facts.target.source != TargetFacts().source


def _release_name(ctx: Context) -> str:
    if ctx.facts.probed is not None:
        version = (ctx.facts.probed_release or {}).get("vllmVersion")
        named = f" (vLLM {str(version)[:40]})" if isinstance(version, str) and version else ""
        return f"the image {ctx.spec.engine.image}{named}"
    return f"vLLM {format_version(ctx.version)}" if ctx.version else "this release"


def check_checkpoint_class(ctx: Context) -> Iterable[Finding]:
    """vLLM instantiates the class the checkpoint's config.json declares."""
    declared = ctx.spec.model.architecture
    if ctx.architecture == declared:
        return
    registered = (ctx.target_caps() or {}).get("registered", True)
    yield Finding(
        "checkpoint-class",
        "Fail",
        Reason.TARGET_ARCHITECTURE_MISMATCH,
        (
            f"the checkpoint's config.json ({ctx.facts.target.source}) declares "
            f"{ctx.architecture}, not spec.model.architecture={declared!r}: vLLM instantiates "
            f"the class the checkpoint declares"
            + ("" if registered else f", and {_release_name(ctx)} has no {ctx.architecture}")
            + "; point spec.model at a Kimi-K3 checkpoint, or set spec.model.architecture to "
            "the class it declares"
        ),
    )


def check_eagle3(ctx: Context) -> Iterable[Finding]:
    method = ctx.spec.drafter.method
    caps = ctx.target_caps()
    if method not in EAGLE3_FAMILY or caps is None or caps.get("registered") is False:
        return
    where = f"{ctx.architecture} on {ctx.platform} in {_release_name(ctx)}"
    if not caps.get("supportsEagle3") and ctx.architecture not in TARGET_ARCHITECTURES:
        # The checkpoint declares a class other than Kimi-K3's (TargetArchitectureMismatch).
        yield Finding(
            "target-eagle3",
            "Fail",
            Reason.TARGET_LACKS_EAGLE3,
            (
                f"spec.drafter.method={method!r} needs a target that declares SupportsEagle3, "
                f"and {where} does not: vLLM would load every weight and then fail with "
                "'Model does not support EAGLE3 interface'; set spec.drafter.method to mtp or "
                "none, or serve a checkpoint whose class declares SupportsEagle3"
            ),
        )
        return
    if not caps.get("supportsEagle3"):
        table = ctx.facts.table
        fixed = table.first_release_where(
            lambda v: bool(
                (table.target(v, ctx.architecture, ctx.platform) or {}).get("supportsEagle3")
            )
        )
        if fixed is not None:
            fix = f"vLLM {format_version(fixed)} fixed it on {ctx.platform}: {_image_fix(fixed)}"
        else:
            release = ctx.release() or {}
            dspark_here = ctx.platform in (
                release.get("drafters", {}).get("K3DSparkModel", {}).get("platforms", [])
            )
            multimodal = "the multimodal checkpoint KimiK3ForConditionalGeneration (served " + (
                "with --language-model-only)"
                if method != "dspark" or dspark_here
                else "with --language-model-only) with an eagle3 drafter, since vLLM has no "
                f"{ctx.platform} DSpark drafter"
            )
            fix = (
                f"no vLLM release up to {format_version(table.releases[-1])} declares it for "
                f"the {ctx.platform} text class; serve {multimodal}, or set drafter.method to "
                "mtp or none"
            )
        yield Finding(
            "target-eagle3",
            "Fail",
            Reason.TARGET_LACKS_EAGLE3,
            (
                f"spec.drafter.method={method!r} needs a target that declares SupportsEagle3, and "
                f"{where} does not: vLLM would load every weight and then fail with "
                f"'Model does not support EAGLE3 interface'; {fix}"
            ),
        )
        return
    mixin = caps.get("innerEagleMixin")
    # None: the probe found no decoder by name in a non-Kimi class; vLLM decides at start.
    if mixin is False or (mixin is None and ctx.architecture in TARGET_ARCHITECTURES):
        yield Finding(
            "target-eagle3",
            "Fail",
            Reason.EAGLE3_DECLARED_NOT_IMPLEMENTED,
            (
                f"{where} declares SupportsEagle3 but its inner model {caps.get('innerModel')} "
                f"lacks EagleModelMixin; set drafter.method to mtp or none, or change engine.image"
            ),
        )
        return
    yield Finding(
        "target-eagle3",
        "Pass",
        Reason.TARGET_SUPPORTS_EAGLE3,
        f"{where} declares SupportsEagle3 and implements it",
    )


def check_pipeline(ctx: Context) -> Iterable[Finding]:
    spec, caps, release = ctx.spec, ctx.target_caps(), ctx.release()
    method = spec.drafter.method
    if spec.parallelism.pipeline <= 1 or method not in EAGLE3_FAMILY or caps is None:
        return
    pp = spec.parallelism.pipeline
    table = ctx.facts.table
    if method == "dspark" and (release or {}).get("dspark", {}).get("refusesPipelineParallel"):
        allowed = _first_release_without(table, "refusesPipelineParallel")
        yield Finding(
            "dspark-pipeline",
            "Fail",
            Reason.DSPARK_REFUSES_PIPELINE_PARALLEL,
            (
                f"spec.parallelism.pipeline={pp} with drafter.method=dspark: {_release_name(ctx)} "
                f"refuses DSpark with pipeline parallelism; set parallelism.pipeline to 1 "
                f"(more tensor parallelism), or {_image_fix(allowed)}"
            ),
        )
        return
    if (release or {}).get("checksAuxHiddenStatesOverPP") and not caps.get(
        "innerAuxHiddenStatesOverPP"
    ):
        yield Finding(
            "dspark-pipeline",
            "Fail",
            Reason.TARGET_LACKS_AUX_HIDDEN_STATES_OVER_PP,
            (
                f"spec.parallelism.pipeline={pp} with drafter.method={method}: the inner model of "
                f"{ctx.architecture} on {ctx.platform} cannot pass aux hidden states between "
                "pipeline stages; set parallelism.pipeline to 1, or drafter.method to mtp or none"
            ),
        )
        return
    yield Finding(
        "dspark-pipeline",
        "Pass",
        Reason.PIPELINE_PARALLEL_SUPPORTED,
        f"{method} with pipeline parallelism {pp} is supported",
    )


def _first_release_without(table: CapabilityTable, dspark_refusal: str) -> Version | None:
    """The first release in the table that no longer has the given DSpark refusal."""
    return table.first_release_where(
        lambda v: not (table.release(v) or {}).get("dspark", {}).get(dspark_refusal)
    )


def check_decode_context(ctx: Context) -> Iterable[Finding]:
    spec, release = ctx.spec, ctx.release()
    dcp = spec.parallelism.decode_context
    if dcp <= 1 or spec.drafter.method != "dspark" or release is None:
        return
    drafter = ctx.facts.drafter
    if (
        drafter is not None
        and drafter.architectures
        and "K3DSparkModel" not in drafter.architectures
    ):
        return  # vLLM's check names the K3 DSpark class; another drafter is judged apart
    if release.get("dspark", {}).get("refusesDecodeContextParallel"):
        table = ctx.facts.table
        allowed = _first_release_without(table, "refusesDecodeContextParallel")
        yield Finding(
            "dspark-decode-context",
            "Fail",
            Reason.DSPARK_REFUSES_DECODE_CONTEXT_PARALLEL,
            (
                f"spec.parallelism.decodeContext={dcp} with drafter.method=dspark: "
                f"{_release_name(ctx)} refuses MLA DSpark with decode-context parallelism; set "
                f"parallelism.decodeContext to 1, or {_image_fix(allowed)}"
            ),
        )
        return
    yield Finding(
        "dspark-decode-context",
        "Pass",
        Reason.DECODE_CONTEXT_PARALLEL_SUPPORTED,
        f"DSpark with decode-context parallelism {dcp} is supported",
    )


def check_decode_context_heads(ctx: Context) -> Iterable[Finding]:
    """vLLM's model config, every release: decode-context parallelism on grouped-query
    attention splits each KV head's query group over ranks that replicate that KV head."""
    dcp, tp = ctx.spec.parallelism.decode_context, ctx.spec.parallelism.tensor
    kv_heads = ctx.facts.target.kv_heads
    if dcp <= 1 or kv_heads is None or _shape_unknown(ctx):
        return
    heads = ctx.facts.target.attention_heads
    where = f"{kv_heads} KV heads ({ctx.facts.target.source})"
    if tp <= kv_heads:
        problem = f"needs spec.parallelism.tensor={tp} greater than the model's {where}"
    elif dcp > tp // kv_heads:
        problem = f"may be at most tensor {tp} / {where} = {tp // kv_heads}"
    elif (heads // kv_heads) % dcp:
        problem = (
            f"must divide the {heads // kv_heads} query heads per KV head "
            f"({heads} attention heads over {kv_heads} KV heads)"
        )
    else:
        yield Finding(
            "decode-context-heads",
            "Pass",
            Reason.DECODE_CONTEXT_PARALLEL_SUPPORTED,
            f"decode-context parallelism {dcp} fits tensor {tp} and the {where}",
        )
        return
    valid = [
        d
        for d in range(1, tp + 1)
        if d == 1
        or (tp % d == 0 and tp > kv_heads and d <= tp // kv_heads and (heads // kv_heads) % d == 0)
    ]
    yield Finding(
        "decode-context-heads",
        "Fail",
        Reason.DECODE_CONTEXT_EXCEEDS_KV_HEADS,
        (
            f"spec.parallelism.decodeContext={dcp} on grouped-query attention {problem}; "
            f"set parallelism.decodeContext to one of {valid}"
        ),
    )


def _fits_nodes(gpus: int, per_node: int) -> bool:
    return gpus <= per_node or gpus % per_node == 0


def _shape_unknown(ctx: Context) -> bool:
    """Kimi-K3's published shape stands in only for a Kimi class: another class's heads and
    experts are known from its config.json (the probe, or --model-config) or not at all."""
    return not _target_config_known(ctx) and ctx.spec.model.architecture not in TARGET_ARCHITECTURES


def check_heads(ctx: Context) -> Iterable[Finding]:
    if _shape_unknown(ctx):
        return
    spec, target = ctx.spec, ctx.facts.target
    tp = spec.parallelism.tensor
    # The attention heads, and where the config gives them the linear-attention layers'
    # (Kimi's KDA layers shard their heads over the tensor size as well).
    kinds = [("attention heads", target.attention_heads)]
    if target.linear_heads:
        kinds.append(("linear-attention (KDA) heads", target.linear_heads))
    refused = [(what, heads) for what, heads in kinds if heads % tp]
    if not refused:
        said = " and ".join(f"the {heads} {what}" for what, heads in kinds)
        yield Finding(
            "tensor-heads", "Pass", Reason.TENSOR_SIZE_DIVIDES_HEADS, f"tensor {tp} divides {said}"
        )
        return
    what, heads = refused[0]
    valid = [
        d
        for d in range(1, max(h for _, h in kinds) + 1)
        if all(h % d == 0 for _, h in kinds)
        and _fits_nodes(d * spec.parallelism.pipeline, spec.placement.gpus_per_node)
    ]
    yield Finding(
        "tensor-heads",
        "Fail",
        Reason.TENSOR_SIZE_DOES_NOT_DIVIDE_HEADS,
        (
            f"spec.parallelism.tensor={tp} does not divide the {heads} {what} "
            f"({target.source}); use one of {valid}"
        ),
    )


def check_nodes(ctx: Context) -> Iterable[Finding]:
    spec = ctx.spec
    gpus, per_node = spec.gpus_per_replica, spec.placement.gpus_per_node
    if _fits_nodes(gpus, per_node):
        yield Finding(
            "whole-nodes",
            "Pass",
            Reason.GPUS_FILL_NODES,
            f"{gpus} GPUs per group on {spec.nodes_per_replica} node(s)",
        )
        return
    yield Finding(
        "whole-nodes",
        "Fail",
        Reason.GPUS_DO_NOT_FILL_NODES,
        (
            f"spec.parallelism tensor x pipeline = {gpus} GPUs neither fits one node nor fills "
            f"whole nodes of placement.gpusPerNode={per_node}; make it at most {per_node} or a "
            "multiple of it"
        ),
    )


def check_experts(ctx: Context) -> Iterable[Finding]:
    spec, target = ctx.spec, ctx.facts.target
    if not spec.parallelism.expert or _shape_unknown(ctx):
        return
    ep = spec.parallelism.tensor
    if target.experts == 0:
        yield Finding(
            "expert-parallel",
            "Fail",
            Reason.EXPERT_PARALLEL_WITHOUT_EXPERTS,
            (
                f"spec.parallelism.expert=true on a dense model ({target.source} names no "
                "experts): vLLM refuses expert parallelism without experts; set "
                "parallelism.expert to false"
            ),
        )
        return
    if target.experts % ep == 0:
        yield Finding(
            "expert-parallel",
            "Pass",
            Reason.EXPERTS_DIVISIBLE,
            f"{target.experts} experts divide over expert-parallel size {ep}",
        )
        return
    yield Finding(
        "expert-parallel",
        "Fail",
        Reason.EXPERTS_NOT_DIVISIBLE,
        (
            f"spec.parallelism.expert=true makes the expert-parallel size the tensor size {ep}, "
            f"which does not divide the {target.experts} experts ({target.source}); change "
            "parallelism.tensor or turn parallelism.expert off"
        ),
    )


def check_extra_args(ctx: Context) -> Iterable[Finding]:
    for i, arg in enumerate(ctx.spec.engine.extra_args):
        flag = owned_flag(arg)
        if flag is not None:
            yield Finding(
                "extra-args",
                "Fail",
                Reason.EXTRA_ARGS_OVERRIDE_OWNED_FLAG,
                (
                    f"spec.engine.extraArgs[{i}]={arg[:200]!r} sets {flag}, which the operator "
                    "generates (vLLM reads _ as -, --flag.key=value as --flag, and "
                    "abbreviations); use the matching spec field instead"
                ),
            )
            return


def _first_release_with_flag(table: CapabilityTable, flag: str) -> Version | None:
    return table.first_release_where(
        lambda v: flag in ((table.release(v) or {}).get("serveFlags") or ())
    )


def check_serve_flags(ctx: Context) -> Iterable[Finding]:
    """Every extraArgs flag against the flags the release's `vllm serve` parser knows (the
    capability table's serveFlags, read from its wheel). The parser takes a flag, or an
    abbreviation of exactly one; anything else it refuses at start. Where the probe ran, the
    image's own parser has answered instead (check_serve_args). A prefill/decode role is
    judged on its own line (the engine's arguments, then the role's)."""
    if ctx.facts.probed is not None:
        return
    release = ctx.release() or {}
    known = release.get("serveFlags")
    if not known:
        return
    for index, arg in enumerate(ctx.spec.engine.extra_args):
        problem = serve_flag_problem(arg, known)
        if problem is None:
            continue
        name = flag_name(arg) or arg
        first = _first_release_with_flag(ctx.facts.table, name)
        since = f"; vLLM {format_version(first)} and later have it" if first else ""
        close = nearest(name, list(known))
        hint = f"; did you mean {close}?" if close else ""
        yield Finding(
            "serve-flags",
            "Fail",
            Reason.SERVE_FLAG_UNKNOWN,
            (
                f"spec.engine.extraArgs[{index}]={arg[:200]!r}: {problem} in "
                f"{_release_name(ctx)}'s `vllm serve`, which would refuse it at start{hint}"
                f"{since}; remove it or change spec.engine.image"
            ),
        )
        return


def check_drafter(ctx: Context) -> Iterable[Finding]:
    spec = ctx.spec
    method = spec.drafter.method
    if method == "none":
        yield Finding("drafter", "Pass", Reason.NO_DRAFTER, "speculative decoding is off", DRAFTER)
        return
    drafter = spec.paired_drafter
    assert drafter is not None
    if method in CHECKPOINT_METHODS and not drafter.location:
        yield Finding(
            "drafter",
            "Fail",
            Reason.DRAFTER_NOT_FOUND,
            (
                f"spec.drafter.repo is empty and no {method} drafter is known for "
                f"spec.model.repo={spec.model.repo!r}; set drafter.repo or drafter.source"
            ),
            DRAFTER,
        )
        return
    yield Finding(
        "method-explicit",
        "Pass",
        Reason.METHOD_EXPLICIT,
        f'the speculative config names "method": "{method}"',
        DRAFTER,
    )
    tp, dtp = spec.parallelism.tensor, drafter.draft_tensor_parallel_size
    if dtp is not None and dtp not in (1, tp):
        yield Finding(
            "draft-tensor",
            "Fail",
            Reason.DRAFT_TENSOR_PARALLEL_SIZE_INVALID,
            (
                f"spec.drafter.draftTensorParallelSize={dtp}: vLLM accepts only 1 or the target's "
                f"tensor size {tp}"
            ),
            DRAFTER,
        )
    if method == "dspark":
        release = ctx.release()
        platforms = (release or {}).get("drafters", {}).get("K3DSparkModel", {}).get("platforms")
        if platforms is not None and ctx.platform not in platforms:
            yield Finding(
                "drafter-platform",
                "Fail",
                Reason.DRAFTER_NOT_IMPLEMENTED_ON_PLATFORM,
                (
                    f"spec.drafter.method=dspark on spec.engine.platform={ctx.platform}: vLLM "
                    f"implements the K3 DSpark drafter only for {platforms}; set drafter.method "
                    "to mtp or none"
                ),
                DRAFTER,
            )
    loadable = list(check_drafter_method(ctx, drafter))
    yield from loadable
    if any(f.status == "Fail" for f in loadable):
        return
    if spec.parallelism.expert and method in CHECKPOINT_METHODS:
        yield from _draft_expert_parallel(ctx)
    # A draft_model drafter is an ordinary model, which may support pipeline stages.
    if spec.parallelism.pipeline > 1 and method in (*EAGLE3_FAMILY, "mtp"):
        yield from _draft_pipeline_parallel(ctx)
    if drafter.num_speculative_tokens is None and method in CHECKPOINT_METHODS:
        required = list(_tokens_required(ctx, drafter))
        yield from required
        if required:
            return
    if method == "mtp" and not drafter.location:
        mtp = list(_mtp_layers(ctx, drafter.num_speculative_tokens))
        yield from mtp
        if any(f.status != "Pass" for f in mtp):
            return
    yield from _drafter_config(ctx, drafter.num_speculative_tokens)


def _draft_expert_parallel(ctx: Context) -> Iterable[Finding]:
    """A release that gives the drafter the target's expert parallelism whatever it is: a
    drafter with no experts (every known Kimi-K3 drafter) fails vLLM's model config."""
    if not (ctx.release() or {}).get("draftInheritsExpertParallel"):
        return
    facts = ctx.facts.drafter
    if facts is not None and facts.experts:
        return  # a mixture-of-experts drafter takes expert parallelism
    yield Finding(
        "draft-expert-parallel",
        "Fail",
        Reason.DRAFT_REFUSES_EXPERT_PARALLEL,
        (
            f"spec.parallelism.expert=true with a {ctx.spec.drafter.method} drafter on vLLM "
            f"{_release_name(ctx)}: that release gives the drafter the target's expert "
            'parallelism, and a drafter with no experts refuses it at start ("Number of '
            'experts in the model must be greater than 0"); turn parallelism.expert off, or '
            "use vllm-openai v0.31.0 or newer"
        ),
        DRAFTER,
    )


def _draft_pipeline_parallel(ctx: Context) -> Iterable[Finding]:
    """A release whose draft takes the target's pipeline size: vLLM checks the draft model
    against it, and no EAGLE3-family or MTP drafter class supports pipeline stages (the
    image probe's own build of the speculative config says the same where it runs)."""
    if ctx.facts.probed is not None or not (ctx.release() or {}).get(
        "draftInheritsPipelineParallel"
    ):
        return
    table = ctx.facts.table
    fixed = table.first_release_where(
        lambda v: not (table.release(v) or {}).get("draftInheritsPipelineParallel")
    )
    yield Finding(
        "draft-pipeline-parallel",
        "Fail",
        Reason.DRAFT_REFUSES_PIPELINE_PARALLEL,
        (
            f"spec.parallelism.pipeline={ctx.spec.parallelism.pipeline} with a "
            f"{ctx.spec.drafter.method} drafter on {_release_name(ctx)}: that release gives the "
            "drafter the target's pipeline size, which no EAGLE3-family or MTP drafter "
            'supports ("Pipeline parallelism is not supported for this model"); set '
            "parallelism.pipeline to 1, or "
            f"{_image_fix(fixed)}"
        ),
        DRAFTER,
    )


def _tokens_required(ctx: Context, drafter: ResolvedDrafter) -> Iterable[Finding]:
    """vLLM defaults num_speculative_tokens to the drafter's n_predict (dspark, from 0.31.0,
    to its block size instead: the table's dsparkTokensFrom), and refuses the speculative
    config when there is none. A known drafter's config has none."""
    facts = ctx.facts.drafter
    fields = ["n_predict"]
    release = ctx.release()
    if drafter.method == "dspark" and release is not None:
        fields = release.get("dsparkTokensFrom") or fields
    elif drafter.method == "dspark":
        # The release is unknown: refused only where every release would refuse it.
        table = ctx.facts.table
        every = [
            f for v in table.releases for f in (table.release(v) or {}).get("dsparkTokensFrom", [])
        ]
        fields = list(dict.fromkeys([*fields, *every]))
    if facts is not None:
        given, source = set(facts.given), facts.source
    elif drafter.repo in KNOWN_DRAFTER_CONFIGS:
        given, source = set(), f"{drafter.repo}'s config.json"
    else:
        return  # the probe reads the drafter's config
    if given & set(fields):
        return
    yield Finding(
        "speculative-tokens",
        "Fail",
        Reason.SPECULATIVE_TOKENS_REQUIRED,
        (
            f"spec.drafter.numSpeculativeTokens is unset and the drafter ({source}) has no "
            f"{' or '.join(fields)} to take it from"
            + (f" under drafter.method={drafter.method}" if fields != ["n_predict"] else "")
            + ": vLLM refuses the speculative config at start; set "
            "drafter.numSpeculativeTokens (the Kimi-K3 recipe uses 8 with DSpark)"
        ),
        DRAFTER,
    )


def _mtp_layers(ctx: Context, tokens: int | None) -> Iterable[Finding]:
    """mtp drafts with the target's own multi-token-prediction layers: vLLM takes their
    count (text_config.num_nextn_predict_layers, 0 when absent) as the drafter's n_predict."""
    layers = ctx.facts.target.mtp_layers
    if layers is None:
        yield Finding(
            "mtp-layers",
            "Unknown",
            Reason.DRAFTER_NEEDS_PROBE,
            (
                "drafter.method=mtp drafts with the target's own MTP layers "
                "(text_config.num_nextn_predict_layers), which only the checkpoint's "
                "config.json says; the image probe reads it"
            ),
            DRAFTER,
        )
        return
    if layers == 0:
        yield Finding(
            "mtp-layers",
            "Fail",
            Reason.TARGET_LACKS_MTP_LAYERS,
            (
                f"drafter.method=mtp, but the target's config.json ({ctx.facts.target.source}) "
                "declares no MTP layers (text_config.num_nextn_predict_layers): vLLM has "
                "nothing to draft with; set drafter.method to dspark, ngram or none"
            ),
            DRAFTER,
        )
        return
    if tokens is not None and tokens % layers:
        yield Finding(
            "mtp-layers",
            "Fail",
            Reason.SPECULATIVE_TOKENS_NOT_DIVISIBLE,
            (
                f"spec.drafter.numSpeculativeTokens={tokens} is not a multiple of the target's "
                f"{layers} MTP layer(s); use a multiple of {layers}"
            ),
            DRAFTER,
        )
        return
    yield Finding(
        "mtp-layers",
        "Pass",
        Reason.PAIRED,
        f"the target has {layers} MTP layer(s) to draft with",
        DRAFTER,
    )


def _drafter_identity(ctx: Context, drafter: ResolvedDrafter) -> tuple[str, str | None, str] | None:
    """(architecture, model_type, where that is known from) of the drafter vLLM would load."""
    facts = ctx.facts.drafter
    if facts is not None and facts.architectures:
        return facts.architectures[0], facts.model_type, facts.source
    if drafter.repo in KNOWN_DRAFTER_CONFIGS:
        architecture, model_type = KNOWN_DRAFTER_CONFIGS[drafter.repo]
        return architecture, model_type, f"the config.json of {drafter.repo}"
    if drafter.method == "mtp" and not drafter.repo:
        return ctx.architecture, TARGET_MODEL_TYPE, "the target checkpoint (mtp drafts from it)"
    return None


def check_drafter_method(ctx: Context, drafter: ResolvedDrafter) -> Iterable[Finding]:
    """Whether vLLM can load this drafter under this method, after vLLM's own renaming: from
    vLLM itself when the image probe built the speculative config, else from the table."""
    method = drafter.method
    who = drafter.location or (
        "the prompt's own n-grams" if method == "ngram" else "the target's own MTP layers"
    )
    probed = (ctx.release() or {}).get("speculative") if ctx.facts.probed is not None else None
    if probed and "ok" in probed:
        if probed.get("ok") is True:
            becomes = probed.get("draftArchitectures") or []
            want = DRAFTER_ARCHITECTURE.get(method)
            if want is not None and becomes and want not in becomes:
                yield Finding(
                    "drafter-method",
                    "Fail",
                    Reason.DRAFTER_ARCHITECTURE_UNSUPPORTED_BY_METHOD,
                    (
                        f"vLLM in spec.engine.image loads {who} under spec.drafter.method="
                        f"{method} as {becomes}, not {want}, the Kimi-K3 {method} drafter; the "
                        f"pods would crash at start; set drafter.repo to a Kimi-K3 {method} "
                        "drafter"
                    ),
                    DRAFTER,
                )
                return
            yield Finding(
                "drafter-method",
                "Pass",
                Reason.DRAFTER_LOADABLE_BY_METHOD,
                f"vLLM in the image builds the {method} speculative config for {who} "
                f"(loads {becomes})",
                DRAFTER,
            )
            return
        error = str(probed.get("error", ""))
        unsupported = "are not supported" in error or "Unsupported speculative method" in error
        yield Finding(
            "drafter-method",
            "Fail",
            Reason.DRAFTER_ARCHITECTURE_UNSUPPORTED_BY_METHOD
            if unsupported
            else Reason.SPECULATIVE_CONFIG_REFUSED,
            (
                f"vLLM in spec.engine.image refuses spec.drafter.method={method} with {who}: "
                f"{error[:400]}; the pods would pull the image and crash at start. "
                "Set drafter.method to one that loads this drafter, or drafter.repo to a "
                f"{method} drafter"
            ),
            DRAFTER,
        )
        return
    release = ctx.release()
    names = (release or {}).get("speculativeMethodNames")
    if names is not None and method not in names:
        table = ctx.facts.table
        offered = table.first_release_where(
            lambda v: method in (table.release(v) or {}).get("speculativeMethodNames", [])
        )
        fix = _image_fix(offered) if offered else "no release in the table has it"
        yield Finding(
            "drafter-method",
            "Fail",
            Reason.SPECULATIVE_CONFIG_REFUSED,
            (
                f"spec.drafter.method={method}: {_release_name(ctx)} has no such speculative "
                f"method (it accepts {', '.join(n for n in names if not n.endswith('_mtp'))}); "
                f"the pods would crash at start; {fix}, or choose another drafter.method"
            ),
            DRAFTER,
        )
        return
    if method == "ngram" and names is not None:
        # No checkpoint to load: vLLM proposes tokens by matching the prompt's n-grams.
        yield Finding(
            "drafter-method",
            "Pass",
            Reason.DRAFTER_LOADABLE_BY_METHOD,
            f"{_release_name(ctx)} offers ngram, which drafts from the prompt itself",
            DRAFTER,
        )
        return
    identity = _drafter_identity(ctx, drafter)
    if method == "draft_model" and identity is None:
        yield Finding(
            "drafter-method",
            "Unknown",
            Reason.DRAFTER_NEEDS_PROBE,
            (
                f"spec.drafter.method=draft_model loads {who} as an ordinary model: its class "
                "and vocabulary are read from its config.json by the image probe "
                "(spec.preflight.probe)"
            ),
            DRAFTER,
        )
        return
    if identity is None and method in CHECKPOINT_METHODS and ctx.known():
        # Which class vLLM loads, and whether the method takes it, is in the drafter's
        # config.json, which nothing here has read: no Pass on facts not held.
        reader = (
            "the image probe ran but could not read it (its report's errors, in "
            "status.capabilities.probe, say why); check drafter.repo, drafter.revision and "
            "hfTokenSecretRef, or drafter.source"
            if ctx.facts.probed is not None
            else "only the image probe reads it (spec.preflight.probe: true), or `kimik3 "
            "preflight --drafter-config DIR` offline"
        )
        yield Finding(
            "drafter-method",
            "Unknown",
            Reason.DRAFTER_NEEDS_PROBE,
            (
                f"spec.drafter.method={method} loads {who}, whose config.json says its class, "
                f"sizes and vocabulary: {reader}"
            ),
            DRAFTER,
        )
        return
    if release is None or identity is None:
        return
    architecture, model_type, source = identity
    verdict = judge(release, method, architecture, model_type)
    if verdict is None:
        return
    if verdict.loadable:
        yield Finding(
            "drafter-method",
            "Pass",
            Reason.DRAFTER_LOADABLE_BY_METHOD,
            f"vLLM's {method} loads {who} (architecture {architecture}) as {verdict.becomes}",
            DRAFTER,
        )
        return
    others = [m for m in methods_that_load(release, architecture, model_type) if m != method]
    fix = (
        f"set drafter.method: {others[0]} for this drafter, or drafter.repo to a {method} drafter"
        if others
        else f"set drafter.repo to a {method} drafter, or drafter.method: none"
    )
    yield Finding(
        "drafter-method",
        "Fail",
        Reason.DRAFTER_ARCHITECTURE_UNSUPPORTED_BY_METHOD,
        (
            f"spec.drafter.method={method} with {who} (architecture {architecture}, from "
            f"{source}): {verdict.why}; the pods would pull the image and crash at start; {fix}"
        ),
        DRAFTER,
    )


def check_serve_args(ctx: Context) -> Iterable[Finding]:
    """The image probe parsed the rendered leader and worker command lines with the image's
    own vLLM argument parser: a flag that release does not know fails here, not after a
    long start."""
    if ctx.facts.probed is None:
        return
    serve = (ctx.release() or {}).get("serve") or {}
    # A role the probe could not parse (no parser found in the image) has no verdict.
    serve = {role: a for role, a in serve.items() if not (a or {}).get("skipped")}
    if not serve:
        return
    for role in sorted(serve):
        answer = serve[role] or {}
        if answer.get("ok"):
            continue
        unknown = list(answer.get("unknownFlags") or [])
        if unknown:
            yield Finding(
                "serve-args",
                "Fail",
                Reason.SERVE_FLAG_UNKNOWN,
                (
                    f"vLLM in spec.engine.image does not know {', '.join(unknown)} on the {role}'s "
                    "command line; remove it from spec.engine.extraArgs, or use an image whose "
                    "vLLM has it"
                ),
            )
        else:
            yield Finding(
                "serve-args",
                "Fail",
                Reason.SERVE_ARGS_REFUSED,
                (
                    f"vLLM in spec.engine.image refuses the {role}'s command line: "
                    f"{str(answer.get('error', ''))[:400]}; fix the value in the spec"
                ),
            )
        return
    yield Finding(
        "serve-args",
        "Pass",
        Reason.SERVE_ARGS_ACCEPTED,
        f"vLLM in the image parses the {' and '.join(sorted(serve))} command lines",
    )


def check_engine_config(ctx: Context) -> Iterable[Finding]:
    """The image probe built vLLM's whole configuration from the leader's command line, as
    `vllm serve` does at start: what the rules do not know, vLLM itself refuses here."""
    if ctx.facts.probed is None:
        return
    engine = (ctx.release() or {}).get("engine") or {}
    if not engine or engine.get("skipped"):
        return
    if engine.get("ok"):
        yield Finding(
            "engine-config",
            "Pass",
            Reason.ENGINE_CONFIG_BUILT,
            (
                "vLLM in the image builds its whole configuration from the leader's command "
                "line; what only the GPU decides (memory for the weights and the KV cache, "
                f"the attention kernels for kvCacheDtype={ctx.spec.engine.kv_cache_dtype}) "
                "is checked when the engine starts"
            ),
        )
        return
    yield Finding(
        "engine-config",
        "Fail",
        Reason.ENGINE_CONFIG_REFUSED,
        (
            "vLLM in spec.engine.image refuses the configuration it would build at start: "
            f"{str(engine.get('error', ''))[:500]}; change the field it names"
        ),
    )


def check_construction(ctx: Context) -> Iterable[Finding]:
    """The image probe constructed the target and the drafter from that configuration on
    PyTorch's meta device, as the model runner does before the first weight: what their
    classes refuse fails here, with vLLM's words and the line that raised them. A class the
    probe could not construct on its CPU node (a GPU kernel chosen in its constructor) has no
    verdict: the finding says so."""
    if ctx.facts.probed is None:
        return
    built = (ctx.release() or {}).get("construct") or {}
    if not built or built.get("skipped"):
        return
    proposer = built.get("proposer")
    proposer = proposer if isinstance(proposer, dict) else {}
    if "model" not in built:
        done = [str(b) for b in built.get("built") or []]
        if isinstance(proposer.get("class"), str):
            done.append(
                f"the drafter's proposer {proposer['class'][:80]} (model runner "
                f"{str(proposer.get('runner', ''))[:8]})"
            )
        if not done:
            return
        missing = built.get("notBuilt")
        missing = missing if isinstance(missing, dict) else {}
        unjudged = "".join(
            f"; the {role} not constructed on the probe's CPU node ({str(why)[:200]}), "
            "so it is judged when the engine starts"
            for role, why in sorted(missing.items())
        )
        yield Finding(
            "construct",
            "Pass",
            Reason.MODELS_CONSTRUCTED,
            (
                f"vLLM in the image constructs {' and '.join(done)} from that configuration "
                f"(on the meta device: every shape, no weights){unjudged}"
            ),
        )
        return
    role = str(built.get("model", "target"))
    # The proposer is built from the drafter's config.json and the speculative config.
    of_drafter = role in ("drafter", "proposer")
    what = (
        f"the drafter's proposer (model runner {str(proposer.get('runner', ''))[:8]})"
        if role == "proposer"
        else f"the {role}"
    )
    owner = "spec.drafter" if of_drafter else "spec.model"
    yield Finding(
        "construct",
        "Fail",
        Reason.MODEL_CONSTRUCTION_REFUSED,
        (
            f"vLLM in spec.engine.image refuses to construct {what} "
            f"({str(built.get('site', ''))[:120]}): {str(built.get('error', ''))[:400]}; the "
            f"pods would load the image and stop before the first weight; change {owner}'s "
            "checkpoint or spec.parallelism to a shape it accepts"
        ),
        DRAFTER if of_drafter else CAPABILITIES,
    )


ALLOW_LONG_MAX_MODEL_LEN = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def check_max_model_len(ctx: Context) -> Iterable[Finding]:
    """vLLM refuses a max_model_len beyond the target's max_position_embeddings unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN is set."""
    target, asked = ctx.facts.target, ctx.spec.engine.max_model_len
    if _shape_unknown(ctx) or target.max_positions is None:
        return
    allowed = any(
        e.get("name") == ALLOW_LONG_MAX_MODEL_LEN and str(e.get("value", "")) not in ("", "0")
        for e in ctx.spec.engine.env
    )
    if asked <= target.max_positions or allowed:
        yield Finding(
            "max-model-len",
            "Pass",
            Reason.MAX_MODEL_LEN_FITS,
            f"engine.maxModelLen {asked} within the target's {target.max_positions} positions",
        )
        return
    yield Finding(
        "max-model-len",
        "Fail",
        Reason.MAX_MODEL_LEN_TOO_LONG,
        (
            f"spec.engine.maxModelLen={asked} is longer than the target's "
            f"max_position_embeddings {target.max_positions} ({target.source}); vLLM refuses "
            f"it at start. Use at most {target.max_positions}"
        ),
    )


def _drafter_config(ctx: Context, tokens: int | None) -> Iterable[Finding]:
    facts, target, method = ctx.facts.drafter, ctx.facts.target, ctx.spec.drafter.method
    if facts is None:
        return
    want = DRAFTER_ARCHITECTURE.get(method)
    if want is not None and want not in facts.architectures:
        yield Finding(
            "drafter-architecture",
            "Fail",
            Reason.DRAFTER_ARCHITECTURE_MISMATCH,
            (
                f"the drafter ({facts.source}) has architectures {list(facts.architectures)}, "
                f"not {want} as drafter.method={method} needs; set drafter.repo to a {method} "
                "drafter or change drafter.method"
            ),
            DRAFTER,
        )
    # vLLM builds the draft model's config against the draft's own parallel config (its
    # tensor size: draftTensorParallelSize, else the target's) and checks its heads as the
    # target's.
    spec = ctx.spec
    draft_tp = spec.drafter.draft_tensor_parallel_size or spec.parallelism.tensor
    if facts.attention_heads and facts.attention_heads % draft_tp:
        yield Finding(
            "drafter-heads",
            "Fail",
            Reason.TENSOR_SIZE_DOES_NOT_DIVIDE_HEADS,
            (
                f"the drafter's {facts.attention_heads} attention heads ({facts.source}) do "
                f"not divide over its tensor size {draft_tp} (spec.drafter."
                "draftTensorParallelSize, else spec.parallelism.tensor): vLLM refuses the "
                "speculative config at start; set spec.drafter.draftTensorParallelSize to 1, "
                "or set drafter.repo to a drafter whose heads divide the tensor size"
            ),
            DRAFTER,
        )
    if facts.n_predict and tokens is not None and tokens % facts.n_predict:
        yield Finding(
            "speculative-tokens",
            "Fail",
            Reason.SPECULATIVE_TOKENS_NOT_DIVISIBLE,
            (
                f"spec.drafter.numSpeculativeTokens={tokens} is not divisible by the drafter's "
                f"n_predict={facts.n_predict}; use a multiple of {facts.n_predict}"
            ),
            DRAFTER,
        )
    # K3 DSpark's config class wants draft_vocab_size equal to vocab_size; an EAGLE3 head's
    # smaller draft vocabulary is its design (vLLM maps it back to the target's).
    sizes = [("vocab_size", facts.vocab_size)]
    if facts.model_type == "k3_dspark":
        sizes.append(("draft_vocab_size", facts.draft_vocab_size))
    for name, size in sizes:
        if size is not None and size != target.vocab_size:
            yield Finding(
                "drafter-vocabulary",
                "Fail",
                Reason.DRAFTER_VOCABULARY_MISMATCH,
                (
                    f"the drafter's {name}={size} differs from the target's vocab_size="
                    f"{target.vocab_size}; set drafter.repo to a drafter trained for this target"
                ),
                DRAFTER,
            )
            break
    if method == "dspark" and facts.model_type == "k3_dspark":
        yield from _dspark_config_refused(ctx, facts)
    if method == "dspark":
        yield from _parallel_drafting_token(ctx, facts)
        ids = facts.target_layer_ids
        problem = ""
        if not ids:
            problem = "has no target_layer_ids"
        elif facts.num_target_layers is not None and facts.num_target_layers != len(ids):
            problem = (
                f"has {len(ids)} target_layer_ids but num_target_layers={facts.num_target_layers}"
            )
        elif target.hidden_layers is not None and max(ids) >= target.hidden_layers:
            problem = (
                f"names target layer {max(ids)} but the target has {target.hidden_layers} layers"
            )
        if problem:
            yield Finding(
                "drafter-target-layers",
                "Fail",
                Reason.DRAFTER_TARGET_LAYERS_INVALID,
                f"the drafter ({facts.source}) {problem}; set drafter.repo to a "
                "drafter built for this target",
                DRAFTER,
            )


def _parallel_drafting_token(ctx: Context, facts: DrafterFacts) -> Iterable[Finding]:
    """DSpark runs on Model Runner V2 in every release, whose speculator fills its parallel
    draft slots with a token it takes from the drafter's config.json (the fields, per
    release, in the table's parallelDraftingTokens); with none of them it refuses to start.
    Where the probe ran it built that speculator itself (check_construction)."""
    if ctx.facts.probed is not None:
        return
    fields = (ctx.release() or {}).get("parallelDraftingTokens") or []
    if not fields or set(fields) & set(facts.given):
        return
    yield Finding(
        "drafter-parallel-drafting-token",
        "Fail",
        Reason.DRAFTER_LACKS_PARALLEL_DRAFTING_TOKEN,
        (
            f"the drafter ({facts.source}) has none of {', '.join(fields)}: "
            f"{_release_name(ctx)}'s DSpark speculator fills its parallel draft slots with "
            "that token and refuses to start without it; set drafter.repo to a DSpark "
            "drafter whose config.json gives it"
        ),
        DRAFTER,
    )


def _dspark_config_refused(ctx: Context, facts: DrafterFacts) -> Iterable[Finding]:
    """vLLM's K3DSparkConfig refuses some MLA options when a DSpark drafter's config.json
    sets them, and a null q_lora_rank; which, per release, the generator reads from it."""
    refuses = (ctx.release() or {}).get("dsparkConfigRefuses") or []
    found = [
        name
        for name in refuses
        if (name.endswith("=None") and name[: -len("=None")] in facts.null_fields)
        or name in facts.set_flags
    ]
    if not found:
        return
    yield Finding(
        "drafter-config",
        "Fail",
        Reason.DRAFTER_CONFIG_REFUSED,
        (
            f"the drafter ({facts.source}) sets {', '.join(found)}: {_release_name(ctx)} "
            f'refuses it when it reads the config ("MLA DSpark does not support '
            f'{", ".join(found)}."); set drafter.repo to a DSpark drafter without them'
        ),
        DRAFTER,
    )


RULES: tuple[Rule, ...] = (
    check_version,
    check_architecture,
    check_eagle3,
    check_checkpoint_class,
    check_pipeline,
    check_decode_context,
    check_decode_context_heads,
    check_heads,
    check_nodes,
    check_experts,
    check_extra_args,
    check_serve_flags,
    check_drafter,
    check_serve_args,
    check_max_model_len,
    check_engine_config,
    check_construction,
)


def run_rules(spec: KimiK3DeploymentSpec, facts: Facts) -> list[Finding]:
    resolved = resolve_version(spec.engine.version, spec.engine.image)
    if spec.disaggregation is None:
        ctx = Context(spec, facts, resolved.version, resolved.source)
        return [finding for rule in RULES for finding in rule(ctx)]
    # Each side of the pair is a deployment of its own for every rule; a finding both sides
    # share is said once, one that differs is said per side.
    per_role = {
        role: [
            finding
            for rule in RULES
            for finding in rule(
                Context(spec.role_spec(role), facts, resolved.version, resolved.source)
            )
        ]
        for role in DISAGGREGATED_ROLES
    }
    prefill, decode = per_role["prefill"], per_role["decode"]
    found = [f for f in prefill if f in decode]
    for role, findings in per_role.items():
        found += [
            dataclasses.replace(f, id=f"{role}/{f.id}", message=f"{role}: {f.message}")
            for f in findings
            if f not in found
        ]
    ctx = Context(spec, facts, resolved.version, resolved.source)
    return found + list(check_kv_transfer(ctx))


# Flags a role's extraArgs may set that enter vLLM's NIXL compatibility hash (the model's
# dtype, the attention backend, the model's shape through an override): set differently on
# the two sides, the first handshake refuses the pair.
HASHED_FLAGS = {
    "--dtype": "dtype",
    "--attention-backend": "attn_backend_name",
    "--hf-overrides": "model (KV heads, head size, layers)",
    "--quantization": "dtype",
}


def _hashed_settings(args: Sequence[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for index, arg in enumerate(args):
        name = arg.split("=", 1)[0].replace("_", "-")
        for flag in HASHED_FLAGS:
            if flag.startswith(name) and name.startswith("--"):
                value = (
                    arg.split("=", 1)[1]
                    if "=" in arg
                    else (args[index + 1] if index + 1 < len(args) else "")
                )
                found[flag] = value
    return found


def check_kv_transfer(ctx: Context) -> Iterable[Finding]:
    """Whether the two sides of spec.disaggregation can hand over the KV cache, by the facts
    of the release read from its wheel: the connector exists; a hybrid target keeps the
    hybrid KV-cache manager through it; no pipeline parallelism vLLM's NIXL refuses; the
    decode-context sizes a hybrid transfer needs equal; and both sides render the same
    factors of NIXL's compatibility hash, which vLLM compares only at the first request."""
    disaggregation = ctx.spec.disaggregation
    if disaggregation is None:
        return
    connector = KV_CONNECTOR_CLASSES[disaggregation.connector]
    release = ctx.facts.table.release(ctx.version) if ctx.version is not None else None
    transfer = (release or {}).get("kvTransfer")
    if not isinstance(transfer, Mapping):
        yield Finding(
            "kv-transfer",
            "Unknown",
            Reason.KV_TRANSFER_NEEDS_PROBE,
            f"the capability table has no KV-transfer facts for {_release_name(ctx)}; "
            f"whether its {connector} can hand over this pair is not known before it runs",
        )
        return
    nixl = transfer.get("nixl") or {}
    prefill, decode = ctx.spec.role_spec("prefill"), ctx.spec.role_spec("decode")
    caps = ctx.target_caps()
    hybrid = None if caps is None else bool(caps.get("isHybrid"))
    problems: list[str] = []
    if connector not in (transfer.get("connectors") or []):
        problems.append(f"vLLM {_release_name(ctx)} registers no {connector}")
    if not transfer.get("hybridKvCacheManagerFlag"):
        problems.append(
            f"vLLM {_release_name(ctx)} has no --disable-hybrid-kv-cache-manager, which the "
            "pair's pods are given"
        )
    if hybrid and not nixl.get("supportsHybridKvCacheManager"):
        problems.append(
            f"{connector} in this release does not support the hybrid KV-cache manager, "
            f"without which {ctx.architecture} (hybrid) cannot start"
        )
    if hybrid and nixl.get("refusesPipelineWithHybrid"):
        for role, side in (("prefill", prefill), ("decode", decode)):
            if side.parallelism.pipeline > 1:
                problems.append(
                    f"{role} has pipeline parallelism {side.parallelism.pipeline}; {connector} "
                    f"refuses pipeline_parallel_size > 1 with a hybrid model's KV cache "
                    f"({ctx.architecture}): use tensor (and expert) parallelism for {role}"
                )
    elif nixl.get("refusesDecodePipeline") and decode.parallelism.pipeline > 1:
        problems.append(
            f"decode has pipeline parallelism {decode.parallelism.pipeline}; {connector}'s "
            "consumer (decode) does not support pipeline_parallel_size > 1"
        )
    dcp = (prefill.parallelism.decode_context, decode.parallelism.decode_context)
    if hybrid and nixl.get("hybridNeedsMatchingDecodeContext") and dcp[0] != dcp[1]:
        problems.append(
            f"the decode-context parallel sizes differ (prefill {dcp[0]}, decode {dcp[1]}); "
            f"{connector} refuses a hybrid model's transfer between them at the handshake"
        )
    hashed = (
        _hashed_settings(disaggregation.prefill.extra_args),
        _hashed_settings(disaggregation.decode.extra_args),
    )
    # Spelled differently is not yet different (--dtype half is float16): vLLM's own hash,
    # in the probe, decides.
    unsure = [
        f"{flag} (prefill {hashed[0].get(flag, 'unset')!r}, decode "
        f"{hashed[1].get(flag, 'unset')!r}; hashed as {HASHED_FLAGS[flag]})"
        for flag in sorted(set(hashed[0]) | set(hashed[1]))
        if hashed[0].get(flag) != hashed[1].get(flag)
    ]
    pair = (ctx.facts.probed_release or {}).get("pair") if ctx.facts.probed is not None else None
    probed = isinstance(pair, Mapping) and "ok" in pair
    if probed and isinstance(pair, Mapping) and not pair.get("ok"):
        if pair.get("side"):
            problems.append(
                f"vLLM in spec.engine.image refuses the {pair['side']} side's configuration: "
                f"{str(pair.get('error', ''))[:400]}"
            )
        else:
            differing = pair.get("differing") or {}
            named = "; ".join(
                f"{key} (prefill {values[0]}, decode {values[1]})"
                for key, values in sorted(differing.items())
                if isinstance(values, list | tuple) and len(values) == 2
            )
            problems.append(
                f"vLLM's own NIXL compatibility hash differs between the roles (prefill "
                f"{pair.get('prefillHash')}, decode {pair.get('decodeHash')}) in {named}: the "
                "decode side's first handshake would refuse every prefill group"
            )
    if problems:
        yield Finding(
            "kv-transfer",
            "Fail",
            Reason.KV_TRANSFER_INCOMPATIBLE,
            "the prefill and decode groups cannot hand over the KV cache: " + "; ".join(problems),
        )
        return
    if unsure and not probed:
        yield Finding(
            "kv-transfer",
            "Unknown",
            Reason.KV_TRANSFER_NEEDS_PROBE,
            "the roles' extraArgs set flags that enter NIXL's compatibility hash differently: "
            + "; ".join(unsure)
            + "; the image probe computes vLLM's own hash of both sides (or set them in "
            "spec.engine.extraArgs for both)",
        )
        return
    if hybrid is None:
        yield Finding(
            "kv-transfer",
            "Unknown",
            Reason.KV_TRANSFER_NEEDS_PROBE,
            f"whether {ctx.architecture} is a hybrid model (which decides what {connector} "
            "refuses) is not in the capability table; the image probe answers it",
        )
        return
    version = nixl.get("connectorVersion")
    if probed and isinstance(pair, Mapping):
        yield Finding(
            "kv-transfer",
            "Pass",
            Reason.KV_TRANSFER_COMPATIBLE,
            f"vLLM in the image builds both roles' configurations and computes the same "
            f"{connector} compatibility hash for them ({pair.get('decodeHash')}, connector "
            f"version {pair.get('connectorVersion')}), and this release's connector takes "
            "the pair's parallelism",
        )
        return
    yield Finding(
        "kv-transfer",
        "Pass",
        Reason.KV_TRANSFER_COMPATIBLE,
        f"both roles render the same factors of {connector}'s compatibility hash (connector "
        f"version {version}: model, dtype, KV-cache dtype, hybrid KV-cache manager, "
        "speculative config, pull mode), and this release's connector takes the pair's "
        "parallelism",
    )
