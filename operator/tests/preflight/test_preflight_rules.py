"""Every preflight rule, passing and failing, and a table over releases x platforms x
architectures x methods x PP/DCP."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import spec_of
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.types import SpecError
from kimik3_operator.preflight.facts import drafter_facts, target_facts
from kimik3_operator.preflight.report import verdict
from kimik3_operator.preflight.rules import Facts, Finding, run_rules
from kimik3_operator.preflight.table import load_table, parse_version, resolve_version

TABLE = load_table()
DSPARK_DRAFTER = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "vocab_size": 163840,
    "draft_vocab_size": 163840,
    "n_predict": 4,
    "target_layer_ids": [2, 23, 47, 71, 89],
    "num_target_layers": 5,
    "dspark_noise_token_id": 163838,
}


def run(facts: Facts | None = None, **spec: Any) -> list[Finding]:
    return run_rules(spec_of(**spec), facts or Facts(TABLE))


def fails(findings: list[Finding]) -> dict[str, Finding]:
    return {f.reason: f for f in findings if f.status == "Fail"}


def image(version: str) -> dict[str, str]:
    return {"image": f"vllm/vllm-openai:v{version}"}


def test_default_spec_passes() -> None:
    findings = run()
    assert verdict(findings) == "Pass"
    assert {f.id for f in findings} >= {
        "vllm-version",
        "architecture",
        "target-eagle3",
        "tensor-heads",
        "whole-nodes",
        "method-explicit",
    }


def test_version_from_tag_or_field() -> None:
    assert resolve_version("", "vllm/vllm-openai:v0.33.0").version == (0, 33, 0)
    assert resolve_version("0.30.0", "registry:5000/vllm:latest").version == (0, 30, 0)
    assert resolve_version("", "vllm/vllm-openai:0.31.0-cu128").version == (0, 31, 0)
    assert resolve_version("", "vllm/vllm-openai@sha256:abc").version is None
    assert resolve_version("", "vllm/vllm-openai").version is None


@pytest.mark.parametrize(
    ("tag", "kind"),
    [
        ("v0.33.0rc1", "a release candidate of 0.33.0"),
        ("v0.33.0-rc.2", "a release candidate of 0.33.0"),
        ("v0.34.0.dev12+g1a2b3c", "a dev build of 0.34.0"),
        ("v0.33.0a1", "an alpha of 0.33.0"),
        ("v0.33.0.post1", "a post release of 0.33.0"),
    ],
)
def test_a_pre_or_post_release_is_not_the_release_the_table_holds(tag: str, kind: str) -> None:
    """A release candidate or a dev build of 0.33.0 is code from before 0.33.0, a post
    release code from after it: the table's 0.33.0 speaks for neither, so the probe asks."""
    resolved = resolve_version("", f"vllm/vllm-openai:{tag}")
    assert resolved.version is None and kind in resolved.source
    [finding] = [
        f for f in run(engine={"image": f"vllm/vllm-openai:{tag}"}) if f.id == "vllm-version"
    ]
    assert (finding.status, finding.reason) == ("Unknown", "VersionUnknown")
    assert kind in finding.message and "probe" in finding.message
    field = resolve_version(tag.lstrip("v"), "vllm/vllm-openai:latest")
    assert field.version is None and field.source.startswith("engine.version: ")
    # A build variant or a local label is the release's own code.
    for same in ("v0.33.0-cu130", "v0.33.0+cu130", "0.33.0_x86"):
        assert resolve_version("", f"vllm/vllm-openai:{same}").version == (0, 33, 0), same


@pytest.mark.parametrize(
    "img", ["vllm/vllm-openai:latest", "vllm/vllm-openai@sha256:0f", "vllm/vllm-openai:nightly"]
)
def test_untellable_version_needs_the_probe(img: str) -> None:
    findings = run(engine={"image": img})
    assert verdict(findings) == "NeedsProbe"
    unknown = next(f for f in findings if f.status == "Unknown")
    assert unknown.reason == "VersionUnknown"
    assert "spec.engine.image" in unknown.message and "spec.engine.version" in unknown.message


def test_newer_than_the_table_needs_the_probe() -> None:
    findings = run(engine=image("0.35.0"))
    assert verdict(findings) == "NeedsProbe"
    assert any(f.reason == "VersionNotInTable" for f in findings)


def test_patch_release_not_in_the_table_is_not_a_silent_pass() -> None:
    assert verdict(run(engine=image("0.33.1"))) == "NeedsProbe"


@pytest.mark.parametrize("old", ["0.26.0", "0.27.0", "0.20.1"])
def test_releases_before_kimi_k3_fail(old: str) -> None:
    failed = fails(run(engine=image(old)))
    assert "VLLMTooOld" in failed
    assert "Kimi-Linear" in failed["VLLMTooOld"].message
    assert "0.27.1" in failed["VLLMTooOld"].message


def test_k31_architecture_only_from_0_34() -> None:
    failed = fails(
        run(engine=image("0.33.0"), model={"architecture": "KimiK31ForConditionalGeneration"})
    )
    assert "ArchitectureNotRegistered" in failed
    assert "v0.34.0" in failed["ArchitectureNotRegistered"].message
    assert (
        verdict(
            run(engine=image("0.34.0"), model={"architecture": "KimiK31ForConditionalGeneration"})
        )
        == "Pass"
    )


def test_text_class_lacks_eagle3_on_0_27_1_nvidia() -> None:
    failed = fails(run(engine=image("0.27.1")))
    message = failed["TargetLacksEagle3"].message
    assert "spec.drafter.method='dspark'" in message
    assert "vLLM 0.28.0 fixed it on nvidia" in message
    assert "vllm/vllm-openai:v0.28.0" in message


def test_amd_text_class_lacks_eagle3_with_alternatives() -> None:
    failed = fails(
        run(
            engine={**image("0.34.0"), "platform": "amd"},
            drafter={"method": "eagle3", "repo": "me/eagle3"},
        )
    )
    message = failed["TargetLacksEagle3"].message
    assert "no vLLM release up to 0.34.0" in message
    assert "KimiK3ForConditionalGeneration" in message and "--language-model-only" in message
    assert "mtp or none" in message


def test_dspark_has_no_amd_implementation() -> None:
    failed = fails(
        run(
            engine={**image("0.33.0"), "platform": "amd"},
            model={"architecture": "KimiK3ForConditionalGeneration"},
        )
    )
    assert "DrafterNotImplementedOnPlatform" in failed
    assert "TargetLacksEagle3" not in failed  # the multimodal class declares it on AMD


def test_mtp_and_none_need_no_eagle3() -> None:
    # mtp drafts with the target's MTP layers, which only its config.json counts: the probe's.
    for method, want in (("mtp", "NeedsProbe"), ("none", "Pass")):
        assert verdict(run(engine={**image("0.27.1")}, drafter={"method": method})) == want
        assert (
            verdict(run(engine={**image("0.33.0"), "platform": "amd"}, drafter={"method": method}))
            == want
        )


@pytest.mark.parametrize(
    ("layers", "tokens", "reason"),
    [(0, None, "TargetLacksMTPLayers"), (2, 3, "SpeculativeTokensNotDivisible"), (2, 4, None)],
)
def test_mtp_drafts_with_the_targets_mtp_layers(
    layers: int, tokens: int | None, reason: str | None
) -> None:
    """vLLM takes text_config.num_nextn_predict_layers (0 when absent) as mtp's n_predict:
    0 fails its speculative config, and the tokens must be a multiple of it."""
    config = {"text_config": {"num_attention_heads": 96, "num_nextn_predict_layers": layers}}
    facts = Facts(TABLE, target=target_facts(config))
    drafter: dict[str, Any] = {"method": "mtp"}
    if tokens is not None:
        drafter["numSpeculativeTokens"] = tokens
    found = fails(run(facts, engine=image("0.33.0"), drafter=drafter))
    assert set(found) == ({reason} if reason else set())


@pytest.mark.parametrize(
    ("version", "refused"),
    [("0.28.0", True), ("0.29.0", True), ("0.30.0", False), ("0.34.0", False)],
)
def test_dspark_with_pipeline_parallelism(version: str, refused: bool) -> None:
    failed = fails(run(engine=image(version), parallelism={"tensor": 8, "pipeline": 2}))
    assert ("DSparkRefusesPipelineParallel" in failed) is refused
    if refused:
        assert "v0.30.0" in failed["DSparkRefusesPipelineParallel"].message


def test_amd_multimodal_cannot_pass_aux_states_over_pp() -> None:
    failed = fails(
        run(
            engine={**image("0.33.0"), "platform": "amd"},
            model={"architecture": "KimiK3ForConditionalGeneration"},
            drafter={"method": "eagle3", "repo": "me/e3"},
            parallelism={"tensor": 8, "pipeline": 2},
        )
    )
    assert "TargetLacksAuxHiddenStatesOverPP" in failed


@pytest.mark.parametrize(
    ("version", "refused"), [("0.27.1", True), ("0.28.0", True), ("0.29.0", False)]
)
def test_dspark_with_decode_context_parallelism(version: str, refused: bool) -> None:
    findings = run(
        engine=image(version), parallelism={"decodeContext": 2}, drafter={"method": "dspark"}
    )
    assert ("DSparkRefusesDecodeContextParallel" in fails(findings)) is refused


def test_tensor_size_must_divide_heads_and_lists_valid_sizes() -> None:
    failed = fails(run(parallelism={"tensor": 64}))
    message = failed["TensorSizeDoesNotDivideHeads"].message
    assert "spec.parallelism.tensor=64" in message and "96 attention heads" in message
    assert "[1, 2, 3, 4, 6, 8, 16, 24, 32, 48, 96]" in message


def test_heads_from_config_json() -> None:
    facts = Facts(TABLE, target=target_facts({"text_config": {"num_attention_heads": 64}}))
    assert "TensorSizeDoesNotDivideHeads" not in fails(run(facts, parallelism={"tensor": 64}))
    assert "TensorSizeDoesNotDivideHeads" in fails(run(facts, parallelism={"tensor": 24}))


def test_experts_divide_by_expert_parallel_size() -> None:
    assert "ExpertsNotDivisible" not in fails(run(parallelism={"tensor": 16, "expert": True}))
    facts = Facts(TABLE, target=target_facts({"num_experts": 900, "num_attention_heads": 96}))
    failed = fails(run(facts, parallelism={"tensor": 16, "expert": True}))
    assert "900 experts" in failed["ExpertsNotDivisible"].message


def test_extra_args_cannot_override_owned_flags() -> None:
    failed = fails(run(engine={"extraArgs": ["--max-num-seqs", "5", "--port=9000"]}))
    assert "spec.engine.extraArgs[2]" in failed["ExtraArgsOverrideOwnedFlag"].message
    assert verdict(run(engine={"extraArgs": ["--max-num-seqs", "5"]})) == "Pass"


def test_drafter_not_found_for_an_unknown_target() -> None:
    failed = fails(run(model={"repo": "someone/Kimi-K3-finetune"}))
    assert failed["DrafterNotFound"].condition == "DrafterPaired"
    assert "set drafter.repo" in failed["DrafterNotFound"].message


@pytest.mark.parametrize("method", ["eagle3", "dflash", "dspark"])
def test_a_drafter_whose_config_nothing_has_read_is_not_passed(method: str) -> None:
    """A drafter repository or volume the operator knows nothing of: which class vLLM
    loads, and whether the method takes it, is only in its config.json. The static stage
    says the probe must read it; with the config read, the verdict is the rules'."""
    for drafter in (
        {"method": method, "repo": "someone/custom-drafter", "numSpeculativeTokens": 3},
        {"method": method, "source": {"pvc": {"claimName": "d"}}, "numSpeculativeTokens": 3},
    ):
        found = {
            f.reason: f
            for f in run(engine=image("0.33.0"), drafter=drafter)
            if f.id == "drafter-method"
        }
        assert set(found) == {"DrafterNeedsProbe"}, drafter
        assert found["DrafterNeedsProbe"].status == "Unknown"
        assert "spec.preflight.probe" in found["DrafterNeedsProbe"].message
        assert verdict(run(engine=image("0.33.0"), drafter=drafter)) == "NeedsProbe"
    from conftest import probe_report
    from kimik3_operator.preflight.gate import probed_facts

    unread = probed_facts(TABLE, {**probe_report(), "drafterConfig": None, "speculative": {}})
    [finding] = [f for f in run(unread, drafter=drafter) if f.id == "drafter-method"]
    assert finding.status == "Unknown" and "could not read it" in finding.message
    read = Facts(TABLE, drafter=drafter_facts(DSPARK_DRAFTER, "the drafter's config.json"))
    custom = {"method": "dspark", "repo": "someone/custom-drafter", "numSpeculativeTokens": 8}
    assert verdict(run(read, engine=image("0.33.0"), drafter=custom)) == "Pass"
    # The drafters whose config the operator knows are judged without the probe.
    assert verdict(run(engine=image("0.33.0"))) == "Pass"


def test_drafter_config_checks() -> None:
    good = Facts(TABLE, drafter=drafter_facts(DSPARK_DRAFTER, "drafter"))
    assert verdict(run(good)) == "Pass"
    wrong_arch = Facts(
        TABLE, drafter=drafter_facts({**DSPARK_DRAFTER, "architectures": ["LlamaForCausalLM"]})
    )
    # vLLM's dspark would load it as DeepSeek-V4's DSparkDraftModel.
    assert "DrafterArchitectureUnsupportedByMethod" in fails(run(wrong_arch))
    vocab = Facts(TABLE, drafter=drafter_facts({**DSPARK_DRAFTER, "draft_vocab_size": 32000}))
    assert "DrafterVocabularyMismatch" in fails(run(vocab))
    layers = Facts(TABLE, drafter=drafter_facts({**DSPARK_DRAFTER, "num_target_layers": 4}))
    assert "DrafterTargetLayersInvalid" in fails(run(layers))
    empty = Facts(TABLE, drafter=drafter_facts({**DSPARK_DRAFTER, "target_layer_ids": []}))
    assert "DrafterTargetLayersInvalid" in fails(run(empty))
    beyond = Facts(
        TABLE, target=target_facts({"num_hidden_layers": 80}), drafter=drafter_facts(DSPARK_DRAFTER)
    )
    assert "DrafterTargetLayersInvalid" in fails(run(beyond))
    tokens = fails(run(good, drafter={"numSpeculativeTokens": 6}))
    assert "n_predict=4" in tokens["SpeculativeTokensNotDivisible"].message


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"mla_use_nope": True}, "mla_use_nope"),
        (
            {"mla_use_qk_norm": True, "dspark_bonus_anchor": True},
            "mla_use_qk_norm, dspark_bonus_anchor",
        ),
        ({"q_lora_rank": None}, "q_lora_rank=None"),
    ],
)
def test_a_dspark_config_vllms_config_class_refuses(change: dict[str, Any], named: str) -> None:
    """vLLM's K3DSparkConfig refuses these when it reads the drafter's config.json (the
    list read from each wheel); false flags and a set q_lora_rank are accepted."""
    facts = Facts(
        TABLE, drafter=drafter_facts({**DSPARK_DRAFTER, **change}, "the drafter's config")
    )
    found = fails(run(facts, engine=image("0.33.0")))
    assert set(found) == {"DrafterConfigRefused"}
    message = found["DrafterConfigRefused"].message
    assert f"sets {named}" in message and "vLLM 0.33.0" in message
    assert found["DrafterConfigRefused"].condition == "DrafterPaired"
    fine = {**DSPARK_DRAFTER, "mla_use_nope": False, "q_lora_rank": 1536}
    facts = Facts(TABLE, drafter=drafter_facts(fine, "the drafter's config"))
    assert verdict(run(facts, engine=image("0.33.0"))) == "Pass"
    assert TABLE.release((0, 33, 0))["dsparkConfigRefuses"][-1] == "q_lora_rank=None"


def test_mtp_drafter_architecture() -> None:
    facts = Facts(TABLE, drafter=drafter_facts({"architectures": ["K3DSparkModel"]}))
    # vLLM's mtp needs an MTP model type; this DSpark drafter has none.
    found = fails(run(facts, drafter={"method": "mtp"}))
    assert "DrafterArchitectureUnsupportedByMethod" in found
    assert "drafter.method: dspark" in found["DrafterArchitectureUnsupportedByMethod"].message


RELEASES = ["0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]
ARCHS = [
    "KimiLinearForCausalLM",
    "KimiK3ForConditionalGeneration",
    "KimiK31ForConditionalGeneration",
]
METHODS = ["dspark", "eagle3", "mtp", "none"]


def expected(version: str, platform: str, arch: str, method: str, pp: int, dcp: int) -> set[str]:
    """The facts of the reference page, written out independently of the table."""
    v = parse_version(version)
    assert v is not None
    reasons = set()
    registered = not (arch == "KimiK31ForConditionalGeneration" and v < (0, 34, 0))
    if not registered:
        reasons.add("ArchitectureNotRegistered")
    eagle_family = method in ("dspark", "eagle3")
    text = arch == "KimiLinearForCausalLM"
    if registered and eagle_family and text and (platform == "amd" or v < (0, 28, 0)):
        reasons.add("TargetLacksEagle3")
    if method == "dspark" and platform == "amd":
        reasons.add("DrafterNotImplementedOnPlatform")
    if registered and eagle_family and pp > 1:
        if method == "dspark" and v < (0, 30, 0):
            reasons.add("DSparkRefusesPipelineParallel")
        elif v >= (0, 30, 0) and platform == "amd":
            reasons.add("TargetLacksAuxHiddenStatesOverPP")
    if method == "dspark" and dcp > 1 and v < (0, 29, 0):
        reasons.add("DSparkRefusesDecodeContextParallel")
    if method != "none" and pp > 1 and v < (0, 30, 0):
        # The draft takes the target's pipeline size; no drafter class supports it.
        reasons.add("DraftRefusesPipelineParallel")
    return reasons


CASES = list(itertools.product(RELEASES, ["nvidia", "amd"], ARCHS, METHODS, [1, 2], [1, 2]))


@pytest.mark.parametrize(("version", "platform", "arch", "method", "pp", "dcp"), CASES)
def test_release_platform_architecture_method_table(
    version: str, platform: str, arch: str, method: str, pp: int, dcp: int
) -> None:
    drafter: dict[str, Any] = {"method": method}
    if method == "eagle3":
        drafter["repo"] = "me/eagle3"
    findings = run(
        engine={**image(version), "platform": platform},
        model={"architecture": arch},
        drafter=drafter,
        parallelism={"tensor": 8, "pipeline": pp, "decodeContext": dcp},
    )
    assert set(fails(findings)) == expected(version, platform, arch, method, pp, dcp)


SPEC_STRATEGY = st.fixed_dictionaries(
    {},
    optional={
        "replicas": st.integers(-2, 5),
        "model": st.fixed_dictionaries(
            {},
            optional={
                "repo": st.sampled_from(["moonshotai/Kimi-K3", "x/y", ""]),
                "architecture": st.sampled_from([*ARCHS, "Nope"]),
            },
        ),
        "drafter": st.fixed_dictionaries(
            {},
            optional={
                "method": st.sampled_from([*METHODS, "dflash", "bogus"]),
                "repo": st.sampled_from(["", "a/b"]),
                "numSpeculativeTokens": st.integers(-1, 20),
                "draftTensorParallelSize": st.integers(0, 32),
            },
        ),
        "engine": st.fixed_dictionaries(
            {},
            optional={
                "image": st.sampled_from(
                    [
                        "vllm/vllm-openai:v0.27.1",
                        "v:latest",
                        "x@sha256:1",
                        "vllm/vllm-openai:v0.34.0",
                        "vllm/vllm-openai:v9.9.9",
                    ]
                ),
                "version": st.sampled_from(["", "0.26.0", "0.33.0", "garbage"]),
                "platform": st.sampled_from(["nvidia", "amd"]),
                "extraArgs": st.lists(st.sampled_from(["--port=1", "--max-num-seqs", "5"])),
            },
        ),
        "parallelism": st.fixed_dictionaries(
            {},
            optional={
                "tensor": st.integers(0, 70),
                "pipeline": st.integers(0, 4),
                "decodeContext": st.integers(0, 3),
                "expert": st.booleans(),
            },
        ),
        "placement": st.fixed_dictionaries({}, optional={"gpusPerNode": st.integers(0, 16)}),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPEC_STRATEGY)
def test_random_specs_never_crash_and_every_fail_names_a_field(raw: dict[str, Any]) -> None:
    try:
        spec = parse_spec(raw)
    except SpecError as err:
        assert err.path.startswith("spec")
        return
    for finding in run_rules(spec, Facts(TABLE)):
        assert finding.status in ("Pass", "Fail", "Unknown")
        if finding.status != "Pass":
            assert finding.reason and finding.reason[0].isupper()
            assert "spec." in finding.message or "drafter" in finding.message, finding


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
}


def probed(architectures: dict[str, Any], speculative: dict[str, Any] | None = None) -> Facts:
    """Facts as the image probe reports them for a tiny non-Kimi checkpoint."""
    return Facts(
        TABLE,
        target=target_facts(TINY_LLAMA, "the target's config.json (probe)"),
        probed=architectures,
        probed_release={"speculative": speculative or {}, "vllmVersion": "0.32.0"},
    )


LLAMA_CAPS = {
    "registered": True,
    "supportsEagle3": True,
    "innerEagleMixin": True,
    "supportsPipelineParallel": True,
}


def test_a_class_outside_the_table_needs_the_probe() -> None:
    findings = run(model={"architecture": "LlamaForCausalLM"}, drafter={"method": "none"})
    architecture = next(f for f in findings if f.id == "architecture")
    assert (architecture.status, architecture.reason) == ("Unknown", "ArchitectureNeedsProbe")
    assert verdict(findings) == "NeedsProbe"


def test_the_probe_judges_any_registered_class() -> None:
    spec = {
        "model": {"architecture": "LlamaForCausalLM"},
        "drafter": {"method": "eagle3", "repo": "org/head"},
        "parallelism": {"tensor": 2},
        "placement": {"gpusPerNode": 1},
    }
    facts = probed(
        {"LlamaForCausalLM": LLAMA_CAPS},
        {"ok": True, "draftArchitectures": ["Eagle3LlamaForCausalLM"]},
    )
    findings = run(facts, **spec)
    assert verdict(findings) == "Pass", [f.message for f in findings if f.status != "Pass"]
    # Gemma declares no SupportsEagle3: the seed's crash, refused from the probe's answer.
    gemma = {**LLAMA_CAPS, "supportsEagle3": False}
    spec["model"] = {"architecture": "GemmaForCausalLM"}
    facts = Facts(
        TABLE,
        target=target_facts({**TINY_LLAMA, "architectures": ["GemmaForCausalLM"]}, "probe"),
        probed={"GemmaForCausalLM": gemma},
        probed_release={"speculative": {"ok": True}},
    )
    assert "TargetLacksEagle3" in fails(run(facts, **spec))


def test_the_probe_refuses_an_unregistered_class() -> None:
    facts = probed({"LlamaForCausalLM": LLAMA_CAPS, "NoSuchForCausalLM": {"registered": False}})
    spec = {"model": {"architecture": "NoSuchForCausalLM"}, "drafter": {"method": "none"}}
    assert "ArchitectureNotRegistered" in fails(run(facts, **spec))


def test_ngram_and_draft_model_are_judged() -> None:
    ngram = run(drafter={"method": "ngram", "numSpeculativeTokens": 3})
    assert verdict(ngram) == "Pass"
    draft = run(drafter={"method": "draft_model", "repo": "org/small", "numSpeculativeTokens": 3})
    method = next(f for f in draft if f.id == "drafter-method")
    assert (method.status, method.reason) == ("Unknown", "DrafterNeedsProbe")
    missing = run(drafter={"method": "draft_model", "numSpeculativeTokens": 3})
    assert "DrafterNotFound" in fails(missing)
    # The probe built vLLM's speculative config with the draft model: judged.
    facts = probed(
        {"LlamaForCausalLM": LLAMA_CAPS},
        {"ok": True, "draftArchitectures": ["LlamaForCausalLM"]},
    )
    spec = {
        "model": {"architecture": "LlamaForCausalLM"},
        "drafter": {"method": "draft_model", "source": {"pvc": {"claimName": "m", "path": "d"}}},
        "parallelism": {"tensor": 2},
        "placement": {"gpusPerNode": 1},
    }
    assert verdict(run(facts, **spec)) == "Pass"
    refused = probed(
        {"LlamaForCausalLM": LLAMA_CAPS}, {"ok": False, "error": "ValueError: vocab differs"}
    )
    assert "SpeculativeConfigRefused" in fails(run(refused, **spec))


def test_the_probe_knows_the_kimi_classes_the_table_judges() -> None:
    from kimik3_operator.api.types import TARGET_ARCHITECTURES
    from kimik3_operator.programs import probe as probe_script

    assert set(probe_script.KIMI_CLASSES) == set(TARGET_ARCHITECTURES)


def test_a_method_the_release_does_not_have_is_refused() -> None:
    """The table records each release's method names (vLLM's SpeculativeMethod literal)."""
    import copy

    from kimik3_operator.preflight.table import CapabilityTable

    data = copy.deepcopy(TABLE.data)
    for version in ("0.27.1", "0.28.0"):
        names = data["releases"][version]["speculativeMethodNames"]
        data["releases"][version]["speculativeMethodNames"] = [n for n in names if n != "ngram"]
    table = CapabilityTable(data)
    spec = {"engine": image("0.27.1"), "drafter": {"method": "ngram", "numSpeculativeTokens": 3}}
    refused = fails(run(Facts(table), **spec))["SpeculativeConfigRefused"]
    assert "has no such speculative method" in refused.message
    assert "vllm/vllm-openai:v0.29.0 or newer" in refused.message
    for version in TABLE.data["releases"]:
        names = TABLE.data["releases"][version]["speculativeMethodNames"]
        assert {"ngram", "draft_model", "eagle3", "dspark", "mtp"} <= set(names), version


def test_kimi_k3_shape_never_stands_in_for_another_class() -> None:
    """Without its config.json, a Llama's heads are unknown, not Kimi-K3's 96."""
    findings = run(
        model={"architecture": "LlamaForCausalLM"},
        drafter={"method": "none"},
        parallelism={"tensor": 2, "expert": True},
        placement={"gpusPerNode": 1},
    )
    assert not {f.id for f in findings} & {"tensor-heads", "expert-parallel"}
    facts = Facts(TABLE, target=target_facts(TINY_LLAMA, "tiny/config.json"))
    findings = run(facts, model={"architecture": "LlamaForCausalLM"}, drafter={"method": "none"})
    heads = next(f for f in findings if f.id == "tensor-heads")
    assert heads.status == "Fail" and "4 attention heads" in heads.message


@pytest.mark.parametrize(
    ("max_model_len", "env", "reason"),
    [
        (1_048_576, [], None),
        (2_000_000, [], "MaxModelLenTooLong"),
        (2_000_000, [{"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "value": "1"}], None),
    ],
)
def test_max_model_len_against_the_targets_positions(
    max_model_len: int, env: list[dict[str, str]], reason: str | None
) -> None:
    """vLLM refuses a max_model_len beyond max_position_embeddings (Kimi-K3: 1,048,576)
    unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set."""
    found = fails(run(engine={"maxModelLen": max_model_len, "env": env}))
    assert set(found) == ({reason} if reason else set())
    if reason:
        assert "1048576" in found[reason].message and "maxModelLen=2000000" in found[reason].message


def test_the_probes_engine_configuration_is_a_verdict() -> None:
    """The image probe's full configuration build: a refusal names vLLM's own message."""
    refused = {"ok": False, "error": "ValidationError: Decode context parallelism for GQA"}
    from conftest import probe_report
    from kimik3_operator.preflight.gate import probed_facts

    for engine, want in (({"ok": True}, None), (refused, "EngineConfigRefused"), ({}, None)):
        facts = probed_facts(TABLE, {**probe_report(), "engine": engine})
        found = fails(run(facts, engine=image("0.33.0")))
        assert set(found) == ({want} if want else set()), engine
        if want:
            assert "Decode context parallelism" in found[want].message


def test_the_probes_construction_is_a_verdict_and_what_it_could_not_build_is_said() -> None:
    """The probe constructs the target and the drafter on the meta device: a refusal names
    vLLM's words, the line and the condition of the model refused; a model it could not
    construct on its CPU node is named as judged at start, never as passed or refused."""
    from conftest import probe_report
    from kimik3_operator.preflight.gate import evaluate, probed_facts
    from kimik3_operator.preflight.probe import ProbeState

    site = "vllm/model_executor/models/llama.py:151"
    refused = {
        "ok": False,
        "model": "drafter",
        "error": "AssertionError: assert self.total_num_kv_heads % tp_size == 0",
        "site": site,
    }
    partial = {
        "ok": False,
        "built": ["drafter: Eagle3LlamaForCausalLM"],
        "notBuilt": {"target": "UnboundLocalError: ... (at vllm/model_executor/layers/x.py:1)"},
    }
    for construct, want in (
        ({"ok": True, "built": ["target: A", "drafter: B"]}, ("Pass", "target: A and drafter: B")),
        (refused, ("Fail", site)),
        (partial, ("Pass", "the target not constructed on the probe's CPU node")),
        (
            {
                "ok": False,
                "built": [],
                "notBuilt": {"target": "x", "drafter": "y"},
                "proposer": {"runner": "v2", "class": "DSparkSpeculator"},
            },
            ("Pass", "the drafter's proposer DSparkSpeculator (model runner v2)"),
        ),
        (
            {
                "ok": False,
                "model": "proposer",
                "error": "ValueError: Model config must specify `dspark_noise_token_id`",
                "site": "vllm/v1/worker/gpu/spec_decode/utils.py:110",
                "proposer": {"runner": "v2"},
            },
            ("Fail", "refuses to construct the drafter's proposer (model runner v2)"),
        ),
        ({"ok": False, "built": [], "notBuilt": {"target": "x"}}, None),
        ({"skipped": "ImportError: no initialize_model"}, None),
        ({}, None),
    ):
        facts = probed_facts(TABLE, {**probe_report(), "construct": construct})
        found = [f for f in run(facts, engine=image("0.33.0")) if f.id == "construct"]
        if want is None:
            assert found == [], construct
            continue
        [finding] = found
        assert finding.status == want[0] and want[1] in finding.message, finding
    [finding] = [
        f
        for f in run(probed_facts(TABLE, {**probe_report(), "construct": refused}))
        if f.id == "construct"
    ]
    assert finding.reason == "ModelConstructionRefused"
    assert finding.condition == "DrafterPaired" and "spec.drafter" in finding.message
    gate = evaluate(
        parse_spec({"engine": {"image": "vllm/vllm-openai:v0.33.0"}}),
        TABLE,
        "now",
        ProbeState("Done", "ProbeDone", "", {**probe_report(), "construct": refused}),
    )
    assert not gate.deploy and gate.drafter.reason == "ModelConstructionRefused"


@pytest.mark.parametrize(
    ("version", "method", "refused"),
    [("0.30.0", "dspark", True), ("0.31.0", "dspark", False), ("0.30.0", "none", False)],
)
def test_a_dense_drafter_under_expert_parallelism(version: str, method: str, refused: bool) -> None:
    """vLLM 0.30.0 gives the drafter the target's expert parallelism: the DSpark drafter,
    which has no experts, then fails its model config. 0.31.0 keeps it off for dense drafters."""
    drafter: dict[str, Any] = {"method": method}
    found = fails(
        run(engine=image(version), parallelism={"tensor": 8, "expert": True}, drafter=drafter)
    )
    assert ("DraftRefusesExpertParallel" in found) is refused
    if refused:
        assert "v0.31.0" in found["DraftRefusesExpertParallel"].message


def test_the_preflight_names_the_argument_and_the_flag() -> None:
    failed = fails(run(engine={"extraArgs": ["--max-num-seqs", "5", "--tensor_parallel_size=4"]}))
    message = failed["ExtraArgsOverrideOwnedFlag"].message
    assert "spec.engine.extraArgs[2]" in message and "--tensor-parallel-size" in message


def test_extra_args_flags_the_release_does_not_know() -> None:
    # --speculative-disable-by-batch-size never was a flag of `vllm serve`; 0.34.0 adds
    # flags that 0.33.0's parser refuses.
    new_in_034 = sorted(
        set(TABLE.data["releases"]["0.34.0"]["serveFlags"])
        - set(TABLE.data["releases"]["0.33.0"]["serveFlags"])
    )
    flag = next(f for f in new_in_034 if f.startswith("--") and not f.startswith("--no-"))
    failed = fails(run(engine={**image("0.33.0"), "extraArgs": ["--max-num-seqs", "5", flag]}))
    message = failed["ServeFlagUnknown"].message
    assert f"spec.engine.extraArgs[2]={flag!r}" in message
    assert "vLLM 0.33.0" in message and "vLLM 0.34.0 and later have it" in message
    assert "ServeFlagUnknown" not in fails(
        run(engine={**image("0.34.0"), "extraArgs": ["--max-num-seqs", "5", flag]})
    )
    typo = fails(run(engine={"extraArgs": ["--max-num-seq", "5", "--enable-prefix-cachng"]}))
    assert "did you mean --enable-prefix-caching?" in typo["ServeFlagUnknown"].message
    ambiguous = fails(run(engine={"extraArgs": ["--max-num", "5"]}))
    assert "--max-num is ambiguous" in ambiguous["ServeFlagUnknown"].message


def test_extra_args_flags_of_each_role_are_checked() -> None:
    failed = fails(
        run(
            parallelism={"tensor": 8},
            disaggregation={"decode": {"extraArgs": ["--speculative-disable-by-batch-size", "4"]}},
        )
    )
    # The role's line: the engine's arguments, then the role's own.
    assert failed["ServeFlagUnknown"].message.startswith("decode: spec.engine.extraArgs[0]=")


def test_extra_args_flags_are_the_image_parsers_once_probed() -> None:
    probed = Facts(TABLE, probed={}, probed_release={"serve": {"leader": {"ok": True}}})
    findings = run(probed, engine={"extraArgs": ["--speculative-disable-by-batch-size", "4"]})
    assert "ServeFlagUnknown" not in fails(findings)


def test_a_dspark_drafter_without_a_parallel_drafting_token() -> None:
    """Model Runner V2's DSpark speculator takes its draft slots' token from the drafter's
    config.json: without any of the fields the release reads, it refuses to start."""
    assert TABLE.data["releases"]["0.33.0"]["parallelDraftingTokens"] == [
        "dflash_config.mask_token_id",
        "mask_token_id",
        "dspark_noise_token_id",
        "pard_token",
        "ptd_token_id",
    ]
    bare = {k: v for k, v in DSPARK_DRAFTER.items() if k != "dspark_noise_token_id"}
    facts = Facts(TABLE, drafter=drafter_facts(bare, "the drafter's config.json"))
    failed = fails(run(facts, engine=image("0.33.0")))
    finding = failed["DrafterLacksParallelDraftingToken"]
    assert finding.condition == "DrafterPaired"
    assert "dspark_noise_token_id" in finding.message and "vLLM 0.33.0" in finding.message
    for token in ({"dflash_config": {"mask_token_id": 7}}, {"mask_token_id": 7}):
        fine = Facts(TABLE, drafter=drafter_facts({**bare, **token}, "the drafter's config.json"))
        assert "DrafterLacksParallelDraftingToken" not in fails(run(fine))
    null = Facts(TABLE, drafter=drafter_facts({**bare, "mask_token_id": None}, "config"))
    assert "DrafterLacksParallelDraftingToken" in fails(run(null))
    # Once probed, the probe built the speculator itself and its verdict stands.
    probed = Facts(TABLE, drafter=facts.drafter, probed={}, probed_release={})
    assert "DrafterLacksParallelDraftingToken" not in fails(run(probed))


def test_configs_given_in_the_spec_are_the_static_stages_facts() -> None:
    import json

    from kimik3_operator.preflight.gate import given_facts

    spec = spec_of(
        model={"config": json.dumps({"text_config": {"num_attention_heads": 64}})},
        parallelism={"tensor": 24},
    )
    failed = fails(run_rules(spec, given_facts(spec, TABLE)))
    assert "TensorSizeDoesNotDivideHeads" in failed
    # An EAGLE3 head the table does not know is the probe's to read, unless the spec gives
    # its config.json.
    eagle3 = {
        "method": "eagle3",
        "repo": "someone/kimi-k3-eagle3",
        "config": json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "vocab_size": 163840,
                "draft_vocab_size": 163840,
            }
        ),
    }
    unread = spec_of(drafter={k: v for k, v in eagle3.items() if k != "config"})
    read = spec_of(drafter=eagle3)
    unknown = {f.reason for f in run_rules(unread, given_facts(unread, TABLE))}
    assert "DrafterNeedsProbe" in unknown
    known = {f.reason for f in run_rules(read, given_facts(read, TABLE))}
    assert "DrafterNeedsProbe" not in known


@pytest.mark.parametrize(
    ("drafter", "why"),
    [
        ({"config": "[1, 2]"}, "is not a JSON object"),
        ({"config": "{"}, "is not JSON"),
        ({"config": '{"a":' * 20 + "1" + "}" * 20}, "nests deeper than 16 levels"),
        ({"config": "[" * 5000 + "]" * 5000}, "nests deeper than 16 levels"),
        ({"method": "ngram", "numSpeculativeTokens": 3, "config": "{}"}, "loads no drafter"),
    ],
)
def test_a_config_given_in_the_spec_is_checked_at_parse(drafter: dict[str, Any], why: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_spec({"drafter": drafter})
    assert "spec.drafter.config" in str(refused.value) and why in str(refused.value)


def test_the_operator_refuses_a_drafter_by_the_config_the_spec_gives() -> None:
    """Before any probe: the gate judges with spec.drafter.config and holds the GPU pods."""
    import json

    from kimik3_operator.preflight.gate import evaluate

    drafter = {**DSPARK_DRAFTER, "mla_use_output_gate": True}
    spec = parse_spec({"drafter": {"config": json.dumps(drafter)}})
    gate = evaluate(spec, TABLE, "now")
    assert not gate.deploy
    assert (gate.drafter.status, gate.drafter.reason) == ("False", "DrafterConfigRefused")
    assert "spec.drafter.config" in gate.drafter.message


def test_linear_attention_heads_from_the_config_shard_over_the_tensor_size() -> None:
    """Kimi's KDA layers assert their own heads divide the tensor size, which vLLM's
    configuration does not check (the probe's construction refuses it too)."""
    text = {"num_attention_heads": 96, "linear_attn_config": {"num_heads": 24}}
    facts = Facts(TABLE, target=target_facts({"text_config": text}, "spec.model.config"))
    failed = fails(run(facts, parallelism={"tensor": 16}))
    message = failed["TensorSizeDoesNotDivideHeads"].message
    assert "the 24 linear-attention (KDA) heads" in message
    assert "use one of [1, 2, 3, 4, 6, 8, 24]" in message
    passed = run(facts, parallelism={"tensor": 8})
    assert "TensorSizeDoesNotDivideHeads" not in fails(passed)
    [heads] = [f for f in passed if f.id == "tensor-heads"]
    assert "the 96 attention heads and the 24 linear-attention (KDA) heads" in heads.message


# A grouped-query Llama as its config.json says it: 64 query heads over 8 KV heads.
GQA_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}


# An EAGLE3 head shaped for Kimi-K3: its vocabulary, 64 attention heads.
EAGLE3_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "vocab_size": 163840,
    "num_attention_heads": 64,
}


def gqa(**spec: Any) -> list[Finding]:
    facts = Facts(TABLE, target=target_facts(GQA_LLAMA, "spec.model.config"))
    spec.setdefault("drafter", {"method": "none"})
    return run(
        facts,
        model={"architecture": "LlamaForCausalLM"},
        engine={**image("0.33.0"), "maxModelLen": 32768, "kvCacheDtype": "auto"},
        **spec,
    )


def test_a_gqa_class_with_its_config_is_judged_without_the_probe() -> None:
    """The table judges the GQA class once its config.json is given; without, the probe."""
    findings = gqa(parallelism={"tensor": 8})
    assert verdict(findings) == "Pass", [f.message for f in findings if f.status != "Pass"]
    architecture = next(f for f in findings if f.id == "architecture")
    assert "registered in vLLM 0.33.0" in architecture.message
    assert verdict(run(model={"architecture": "LlamaForCausalLM"}, drafter={"method": "none"})) == (
        "NeedsProbe"
    )


@pytest.mark.parametrize(
    ("tensor", "dcp", "said"),
    [
        (8, 1, None),
        (16, 2, None),
        (8, 2, "greater than the model's 8 KV heads"),
        (16, 4, "may be at most tensor 16 / 8 KV heads"),
        (64, 8, None),
    ],
)
def test_decode_context_parallel_on_gqa_against_the_kv_heads(
    tensor: int, dcp: int, said: str | None
) -> None:
    """vLLM's model config (every release): DCP on GQA needs more tensor ranks than KV
    heads, at most tensor/KV-heads ranks, and a size dividing the query heads per KV head."""
    findings = gqa(
        parallelism={"tensor": tensor, "decodeContext": dcp}, placement={"gpusPerNode": 8}
    )
    failed = fails(findings)
    if said is None:
        assert "DecodeContextExceedsKVHeads" not in failed
        return
    message = failed["DecodeContextExceedsKVHeads"].message
    assert said in message and "spec.parallelism.decodeContext" in message


def test_query_heads_per_kv_head_bound_decode_context() -> None:
    odd = {**GQA_LLAMA, "num_attention_heads": 24, "num_key_value_heads": 2}
    facts = Facts(TABLE, target=target_facts(odd, "spec.model.config"))
    failed = fails(
        run(
            facts,
            model={"architecture": "LlamaForCausalLM"},
            drafter={"method": "none"},
            engine={**image("0.33.0"), "maxModelLen": 32768},
            parallelism={"tensor": 16, "decodeContext": 8},
            placement={"gpusPerNode": 8},
        )
    )
    assert "12 query heads per KV head" in failed["DecodeContextExceedsKVHeads"].message


def test_mla_is_not_checked_against_kv_heads() -> None:
    """Kimi-K3's MLA: vLLM checks decode-context parallelism against KV heads only on GQA."""
    findings = run(engine=image("0.33.0"), parallelism={"tensor": 8, "decodeContext": 8})
    assert "DecodeContextExceedsKVHeads" not in fails(findings)
    assert target_facts(None).kv_heads is None


def test_expert_parallel_on_a_dense_model() -> None:
    failed = fails(gqa(parallelism={"tensor": 8, "expert": True}))
    assert "a dense model" in failed["ExpertParallelWithoutExperts"].message


@pytest.mark.parametrize(
    ("version", "config", "refused"),
    [
        ("0.30.0", {"n_predict": 8}, False),
        ("0.30.0", {"block_size": 16}, True),
        ("0.33.0", {"block_size": 16}, False),
        ("0.33.0", {"dspark_block_size": 16}, False),
        ("0.33.0", {"n_predict": 8}, True),
        ("0.34.0", {"block_size": 16}, False),
    ],
)
def test_dspark_takes_its_token_count_from_where_the_release_does(
    version: str, config: dict[str, Any], refused: bool
) -> None:
    """dspark defaults num_speculative_tokens to the drafter's block size from 0.31.0 (read
    from each wheel as dsparkTokensFrom), to its n_predict before."""
    facts = Facts(TABLE, drafter=drafter_facts({**DSPARK_DRAFTER, "n_predict": None, **config}))
    custom = {"method": "dspark", "repo": "someone/custom-drafter"}
    findings = run(facts, engine=image(version), drafter=custom)
    assert ("SpeculativeTokensRequired" in fails(findings)) is refused
    assert TABLE.release(parse_version(version))["dsparkTokensFrom"] == (
        [] if version == "0.30.0" else ["block_size", "dspark_block_size"]
    )


def test_an_eagle3_heads_smaller_draft_vocabulary_is_its_design() -> None:
    """An EAGLE3 head drafts over a smaller vocabulary vLLM maps back; K3 DSpark's config
    class wants them equal."""
    head = {**EAGLE3_HEAD, "draft_vocab_size": 32000}
    facts = Facts(TABLE, drafter=drafter_facts(head, "the head's config.json"))
    findings = run(
        facts,
        engine=image("0.33.0"),
        drafter={"method": "eagle3", "repo": "example/head", "numSpeculativeTokens": 3},
    )
    assert "DrafterVocabularyMismatch" not in fails(findings)
    other = Facts(TABLE, drafter=drafter_facts({**head, "vocab_size": 128256}, "the head's"))
    findings = run(
        other,
        engine=image("0.33.0"),
        drafter={"method": "eagle3", "repo": "example/head", "numSpeculativeTokens": 3},
    )
    assert "DrafterVocabularyMismatch" in fails(findings)


def test_dsparks_decode_context_refusal_names_the_k3_dspark_class() -> None:
    """0.27.1 and 0.28.0 refuse decode-context parallelism for the K3 DSpark drafter only."""
    spec = {"engine": image("0.27.1"), "parallelism": {"tensor": 16, "decodeContext": 8}}
    k3 = Facts(TABLE, drafter=drafter_facts(DSPARK_DRAFTER, "the drafter's config.json"))
    assert "DSparkRefusesDecodeContextParallel" in fails(run(k3, **spec))
    other = Facts(
        TABLE,
        drafter=drafter_facts({**DSPARK_DRAFTER, "architectures": ["LlamaForCausalLMEagle3"]}),
    )
    assert "DSparkRefusesDecodeContextParallel" not in fails(run(other, **spec))


def test_the_drafters_heads_against_its_tensor_size() -> None:
    """vLLM checks the draft model's heads against the draft's tensor size (the target's,
    unless draftTensorParallelSize says 1)."""
    head = {**EAGLE3_HEAD, "num_attention_heads": 28}
    facts = Facts(TABLE, drafter=drafter_facts(head, "the head's config.json"))
    drafter = {"method": "eagle3", "repo": "example/head", "numSpeculativeTokens": 3}
    findings = run(facts, engine=image("0.33.0"), drafter=drafter)
    refused = next(f for f in findings if f.id == "drafter-heads")
    assert refused.status == "Fail" and "28 attention heads" in refused.message
    assert "draftTensorParallelSize to 1" in refused.message
    alone = run(facts, engine=image("0.33.0"), drafter={**drafter, "draftTensorParallelSize": 1})
    assert "drafter-heads" not in {f.id for f in alone}


@pytest.mark.parametrize(("version", "refused"), [("0.29.0", True), ("0.30.0", False)])
def test_a_draft_model_takes_the_targets_pipeline_size_through_0_29(
    version: str, refused: bool
) -> None:
    """Through 0.29.0 vLLM gives the draft the target's pipeline size (read from each wheel
    as draftInheritsPipelineParallel), which no drafter class supports."""
    head = EAGLE3_HEAD
    facts = Facts(TABLE, drafter=drafter_facts(head, "the head's config.json"))
    findings = run(
        facts,
        model={"architecture": "KimiK3ForConditionalGeneration"},
        engine=image(version),
        drafter={"method": "eagle3", "repo": "example/head", "numSpeculativeTokens": 3},
        parallelism={"tensor": 8, "pipeline": 2},
    )
    failed = fails(findings)
    assert ("DraftRefusesPipelineParallel" in failed) is refused
    if refused:
        assert "vllm/vllm-openai:v0.30.0 or newer" in failed["DraftRefusesPipelineParallel"].message
