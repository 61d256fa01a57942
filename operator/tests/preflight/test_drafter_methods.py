"""What each speculative method does to a drafter, per release in the table (generated from
the wheels), and the preflight finding a user sees for a drafter its method cannot load."""

from __future__ import annotations

import pytest

from conftest import spec_of
from kimik3_operator.preflight.drafter_methods import (
    dspark_rule,
    eagle_renames,
    judge,
    methods_that_load,
    mtp_rule,
)
from kimik3_operator.preflight.rules import Facts, run_rules
from kimik3_operator.preflight.table import load_table

TABLE = load_table()
RELEASES = sorted(TABLE.data["releases"])
# Per method: (architecture, model_type) it loads and one it refuses, with what vLLM asks
# its registry for in the refused case.
CASES = {
    "eagle3": (
        ("LlamaForCausalLM", "llama"),
        ("K3DSparkModel", "k3_dspark"),
        "Eagle3K3DSparkModel",
    ),
    "dflash": (
        ("DFlashDraftModel", "qwen3"),
        ("K3DSparkModel", "k3_dspark"),
        "DFlashK3DSparkModel",
    ),
    "dspark": (("K3DSparkModel", "k3_dspark"), ("LlamaForCausalLM", "llama"), None),
    "mtp": (("KimiLinearForCausalLM", "kimi_k3"), ("K3DSparkModel", "k3_dspark"), None),
}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("method", sorted(CASES))
def test_each_method_loads_one_drafter_and_refuses_another(release: str, method: str) -> None:
    entry = TABLE.data["releases"][release]
    accepted, refused, becomes = CASES[method]
    ok = judge(entry, method, *accepted)
    assert ok is not None and ok.loadable, (release, method, ok)
    bad = judge(entry, method, *refused)
    assert bad is not None and not bad.loadable, (release, method, bad)
    if becomes is not None:
        assert bad.becomes == becomes


def test_dspark_turns_an_unknown_drafter_into_deepseek_v4s_until_0_34() -> None:
    for release in RELEASES:
        verdict = judge(TABLE.data["releases"][release], "dspark", "LlamaForCausalLM", "llama")
        assert verdict is not None
        expected = "LlamaForCausalLM" if release == "0.34.0" else "DSparkDraftModel"
        assert verdict.becomes == expected, release


def test_mtp_renames_the_kimi_k3_target_to_its_mtp_model() -> None:
    verdict = judge(TABLE.data["releases"]["0.33.0"], "mtp", "KimiLinearForCausalLM", "kimi_k3")
    assert verdict is not None and verdict.becomes == "KimiK3MTPModel" and verdict.loadable


def test_the_k3_dspark_drafter_loads_only_under_dspark() -> None:
    entry = TABLE.data["releases"]["0.33.0"]
    assert methods_that_load(entry, "K3DSparkModel", "k3_dspark") == ["dspark"]


def test_eagle3_with_the_dspark_drafter_is_refused_before_any_pod() -> None:
    spec = spec_of(
        drafter={"method": "eagle3", "repo": "RedHatAI/Kimi-K3-speculator.dspark"},
    )
    findings = [f for f in run_rules(spec, Facts(TABLE)) if f.status == "Fail"]
    assert [f.reason for f in findings] == ["DrafterArchitectureUnsupportedByMethod"]
    message = findings[0].message
    assert "spec.drafter.method=eagle3" in message
    assert "Eagle3K3DSparkModel" in message
    assert "set drafter.method: dspark" in message
    assert findings[0].condition == "DrafterPaired"


def test_the_recipe_pairing_passes() -> None:
    findings = run_rules(spec_of(), Facts(TABLE))
    method = [f for f in findings if f.id == "drafter-method"]
    assert [(f.status, f.reason) for f in method] == [("Pass", "DrafterLoadableByMethod")]


def test_mtp_without_a_drafter_repo_drafts_from_the_target() -> None:
    findings = run_rules(spec_of(drafter={"method": "mtp"}), Facts(TABLE))
    assert not [f for f in findings if f.status == "Fail"]


EAGLE_SOURCE = """
class EAGLEConfig(PreTrainedConfig):
    def __init__(self, model=None, method="eagle", **kwargs):
        if method == "eagle":
            kwargs["architectures"] = [
                f"Eagle{arch}" if not arch.startswith("Eagle") else arch
                for arch in self.model.architectures
            ]
        elif method == "eagle3":
            kwargs["architectures"] = [
                arch if arch.startswith("Eagle3") or arch.endswith("Eagle3") else f"Eagle3{arch}"
                for arch in self.model.architectures
            ]
"""

SPECULATIVE_SOURCE = """
MTPModelTypes = Literal["deepseek_mtp", "kimi_k3_mtp"]
_OMNI = "OmniDSparkModel"

class SpeculativeConfig:
    @staticmethod
    def hf_config_override(hf_config):
        if hf_config.model_type == "kimi_k3":
            hf_config.model_type = "kimi_k3_mtp"
            hf_config.update({"n_predict": 1, "architectures": ["KimiK3MTPModel"]})

    def __post_init__(self):
        if self.method == "dspark" and (
            "K3DSparkModel" not in self.draft_model_config.architectures
            and _OMNI not in self.draft_model_config.architectures
        ):
            draft_hf_config.architectures = ["V41" if is_v41 else "DSparkDraftModel"]
"""


def test_the_rules_are_read_from_the_source_as_written() -> None:
    renames = eagle_renames(EAGLE_SOURCE)
    assert renames["eagle"]["prefix"] == "Eagle"
    assert renames["eagle"]["unlessStartsWith"] == ["Eagle"]
    assert renames["eagle3"]["unlessEndsWith"] == ["Eagle3"]
    assert dspark_rule(SPECULATIVE_SOURCE) == {
        "keeps": ["K3DSparkModel", "OmniDSparkModel"],
        "otherwiseBecomes": "DSparkDraftModel",
    }
    assert mtp_rule(SPECULATIVE_SOURCE) == {
        "modelTypes": ["deepseek_mtp", "kimi_k3_mtp"],
        "modelTypeRenames": {
            "kimi_k3": {"modelType": "kimi_k3_mtp", "architecture": "KimiK3MTPModel"}
        },
    }
    assert dspark_rule("x = 1") == {"keepsAll": True}


@pytest.mark.parametrize("release", RELEASES)
def test_the_table_says_per_platform_which_method_loads_the_k3_drafters(release: str) -> None:
    table = TABLE.data["releases"][release]["drafterAcceptance"]
    # The K3 DSpark drafter loads under dspark on NVIDIA only (its class is NVIDIA-only).
    assert table["nvidia"]["dspark"]["K3DSparkModel"]["loadable"] is True
    assert table["amd"]["dspark"]["K3DSparkModel"]["loadable"] is False
    for platform in ("nvidia", "amd"):
        assert table[platform]["eagle3"]["K3DSparkModel"] == {
            "becomes": "Eagle3K3DSparkModel",
            "loadable": False,
        }
        # mtp drafts from the target's own MTP layers on both platforms.
        assert table[platform]["mtp"]["KimiLinearForCausalLM"] == {
            "becomes": "KimiK3MTPModel",
            "loadable": True,
        }


def test_what_the_dspark_config_class_refuses_is_read_from_its_source() -> None:
    from kimik3_operator.preflight.generate import dspark_config_refusals

    source = (
        "class K3DSparkConfig(Base):\n"
        "    def __init__(self, **kw):\n"
        "        unsupported = [n for n in ('mla_use_nope', 'new_flag') if getattr(self, n)]\n"
        "        if self.q_lora_rank is None:\n"
        "            unsupported.append('q_lora_rank=None')\n"
        "        other.append('not a refusal')\n"
    )
    assert dspark_config_refusals(source) == ["mla_use_nope", "new_flag", "q_lora_rank=None"]
    assert dspark_config_refusals("") == []
    assert dspark_config_refusals("class Other: pass\n") == []
