"""The static preflight against vLLM's own configuration code.

Generates specs across the CRD's space (architectures, platforms, every method with its
drafter, speculative tokens, tensor/pipeline/decode-context/expert parallel sizes, KV-cache
dtypes, sampling and rejection methods, context lengths, the drafter's config.json as
published and as some checkpoints have it, engine.extraArgs as users spell them, the forms of
an image's tag), judges each with the static rules
and the capability table, and asks vLLM itself: the leader's rendered command line goes
through the release's own parser to EngineArgs and the full VllmConfig, with the target's
and the drafter's config.json as the spec implies (the image probe's check_engine; the
device is stubbed as it says). Prints the agreement per release and per kind of spec and
every disagreement with vLLM's message.

A static Pass that vLLM refuses is a rule bug; a static Fail that vLLM accepts is a false
alarm, unless every failing rule is one vLLM decides later than its configuration (at model
load or by the scheduler): those are counted apart, as refused earlier than vLLM would.
Specs the static stage leaves to the probe (NeedsProbe) are counted, not compared.

    .venv/bin/python bench/differential.py                         # every release with a venv
    .venv/bin/python bench/differential.py --release 0.33.0 --sample 200 --seed 1
    .venv/bin/python bench/differential.py --write                 # record beside the table

A release's venv: KIMIK3_VLLM_PYTHON_<version with _>, ~/.cache/kimik3-operator/vllm-<version>,
or its Python sources alone (`bash scripts/vllm-overlay.sh VERSION`, about 100 MB) run over the
0.33.0 venv's torch and transformers: the release's own configuration code, on another
release's dependencies.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import math
import os
import pathlib
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from kimik3_operator.api.constants import Reason  # noqa: E402 - after the path
from kimik3_operator.api.parse import parse_spec  # noqa: E402
from kimik3_operator.api.types import (  # noqa: E402
    GQA_ARCHITECTURES,
    SpecError,
)
from kimik3_operator.builders.command import expanded_serve_args  # noqa: E402
from kimik3_operator.preflight.drafter_methods import judge  # noqa: E402
from kimik3_operator.preflight.facts import (  # noqa: E402
    KIMI_K3_CONTEXT,
    KIMI_K3_EXPERTS,
    KIMI_K3_HEADS,
    KIMI_K3_VOCAB,
    drafter_facts,
)
from kimik3_operator.preflight.gate import given_facts  # noqa: E402
from kimik3_operator.preflight.rules import DRAFTER_ARCHITECTURE, run_rules  # noqa: E402
from kimik3_operator.preflight.table import (  # noqa: E402
    format_version,
    load_table,
    parse_version,
)
from kimik3_operator.programs import probe as probe_script  # noqa: E402

RECORD = ROOT / "operator" / "kimik3_operator" / "data" / "differential.json"
# Rules whose refusal vLLM makes later than its configuration: at model load (the class's
# interfaces, the worker's drafter checks) or never (the scheduler places the pods).
DECIDED_LATER = frozenset(
    {
        Reason.TARGET_LACKS_EAGLE3,
        Reason.EAGLE3_DECLARED_NOT_IMPLEMENTED,
        Reason.DSPARK_REFUSES_PIPELINE_PARALLEL,
        Reason.TARGET_LACKS_AUX_HIDDEN_STATES_OVER_PP,
        Reason.DRAFTER_NOT_IMPLEMENTED_ON_PLATFORM,
        Reason.EXPERTS_NOT_DIVISIBLE,
        Reason.GPUS_DO_NOT_FILL_NODES,
        # Model Runner V2's speculator, built after the configuration.
        Reason.DRAFTER_LACKS_PARALLEL_DRAFTING_TOKEN,
        # A drafter of another vocabulary: vLLM starts it (K3 DSpark's own draft vocabulary
        # aside) and rejects its every draft.
        Reason.DRAFTER_VOCABULARY_MISMATCH,
    }
)


def decided_later(point: Mapping[str, Any], version: str) -> frozenset[str]:
    """DECIDED_LATER, and what the rules say of a drafter that is not the method's own (an
    EAGLE3 or DFlash head under dspark) where vLLM configures it as a class its registry has
    (DeepSeek-V4's DSparkDraftModel, or from 0.34.0 the head's own class): the configuration
    builds, and the speculator or the model fails when it is built or loaded."""
    release = load_table().release(parse_version(version)) or {}
    config = drafter_config(point)
    architectures = config.get("architectures") or [None]
    verdict = (
        judge(release, point["method"], architectures[0], config.get("model_type"))
        if uses_drafter_config(point) and architectures[0]
        else None
    )
    registered = set(release.get("speculativeArchitectures") or [])
    later = DECIDED_LATER
    ids = config.get("target_layer_ids")
    if uses_drafter_config(point) and ids and config.get("num_target_layers") in (None, len(ids)):
        # The drafter's own layer list is whole; that the target lacks a layer it names
        # surfaces only when the drafter reads the target's hidden states.
        later = later | {Reason.DRAFTER_TARGET_LAYERS_INVALID}
    own = DRAFTER_ARCHITECTURE.get(point["method"], architectures[0])
    if (
        verdict is not None
        and verdict.becomes in registered
        and (not verdict.loadable or architectures[0] != own)
    ):
        return later | {
            Reason.DRAFTER_ARCHITECTURE_UNSUPPORTED_BY_METHOD,
            Reason.DRAFTER_ARCHITECTURE_MISMATCH,
            Reason.DRAFTER_TARGET_LAYERS_INVALID,
        }
    return later


DSPARK_REPO = "RedHatAI/Kimi-K3-speculator.dspark"


# The other attention type: a grouped-query Llama (64 query heads over 8 KV heads), whose
# config.json the spec gives (spec.model.config), as the static stage then judges it.
GQA_TARGET: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}


def target_config(architecture: str) -> dict[str, Any]:
    """Kimi-K3's config.json as published (facts.py): MLA attention, 896 experts; or the GQA
    Llama's."""
    if architecture in GQA_ARCHITECTURES:
        return {**GQA_TARGET, "architectures": [architecture]}
    return {
        "model_type": "kimi_k3",
        "architectures": [architecture],
        "text_config": {
            "model_type": "kimi_linear",
            "num_attention_heads": KIMI_K3_HEADS,
            "num_key_value_heads": KIMI_K3_HEADS,
            "num_experts": KIMI_K3_EXPERTS,
            "vocab_size": KIMI_K3_VOCAB,
            "max_position_embeddings": KIMI_K3_CONTEXT,
            "hidden_size": 7168,
            "num_hidden_layers": 93,
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
        },
    }


# With the field Model Runner V2's DSpark speculator takes its parallel draft token from.
DSPARK_CONFIG: dict[str, Any] = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "vocab_size": KIMI_K3_VOCAB,
    "draft_vocab_size": KIMI_K3_VOCAB,
    "target_layer_ids": [2, 23, 47, 71, 89],
    "num_target_layers": 5,
    "dspark_noise_token_id": 163838,
}

# EAGLE3 and DFlash heads of the EAGLE3 family's other kinds, shaped for Kimi-K3 (hidden size
# 7168, its vocabulary): a Llama EAGLE3 head and a Qwen3 DFlash head.
EAGLE3_HEAD: dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 1,
    "vocab_size": KIMI_K3_VOCAB,
    "draft_vocab_size": 32000,
    "max_position_embeddings": 131072,
}
DFLASH_HEAD: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 2,
    "vocab_size": KIMI_K3_VOCAB,
    "max_position_embeddings": 131072,
    "block_size": 16,
    "dflash_config": {"mask_token_id": 163838, "target_layer_ids": [1, 30, 60, 89]},
}


def _without_nulls(config: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """A field a variant sets to None is left out of the file."""
    return {k: v for k, v in config.items() if v is not None or k not in base}


# The drafter's config.json, (its repository, the file): the DSpark drafter as published and
# as some checkpoints have it (what vLLM's K3DSparkConfig refuses when it reads the file), and
# heads of the other kinds. A variant is judged by the static rules with the file read (as
# the probe reads it, or `kimik3 preflight --drafter-config`); the published file as the
# static stage alone knows the paired repository.
DRAFTER_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    name: (DSPARK_REPO, _without_nulls({**DSPARK_CONFIG, **changed}, DSPARK_CONFIG))
    for name, changed in {
        "published": {},
        "mla_use_nope": {"mla_use_nope": True},
        "mla_use_output_gate": {"mla_use_output_gate": True},
        "q_lora_rank_null": {"q_lora_rank": None},
        "draft_vocab": {"draft_vocab_size": 32000},
        "target_layers": {"num_target_layers": 4},
        "no_parallel_drafting_token": {"dspark_noise_token_id": None},
        # Where dspark takes its token count from 0.31.0 when the spec gives none.
        "block_size": {"block_size": 8},
    }.items()
} | {
    "eagle3_head": ("example/kimi-k3-eagle3-head", EAGLE3_HEAD),
    # 28 heads: the draft model's attention against the draft tensor-parallel size.
    "eagle3_head_28_heads": (
        "example/kimi-k3-eagle3-head",
        {**EAGLE3_HEAD, "num_attention_heads": 28, "num_key_value_heads": 4},
    ),
    "dflash_head": ("example/kimi-k3-dflash-head", DFLASH_HEAD),
}

# engine.extraArgs as users write them: each judged by the static check against the
# release's serveFlags and by the release's own parser.
EXTRA_ARGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "known": ("--max-num-seqs", "64"),
    "abbreviated": ("--max-num-se", "64"),
    "ambiguous": ("--max-num", "64"),
    "typo": ("--enable-prefix-cachng",),
    "negated": ("--no-enable-prefix-caching",),
    "gone-after-0.27": ("--calculate-kv-scales",),
    "new-in-0.29": ("--max-num-queued-reqs", "4096"),
}
# How an image names its release: the tag forms the static stage maps to a release (a CUDA
# variant), and those it leaves to the probe (a release candidate; a digest alone).
TAGS: dict[str, str] = {
    "release": "vllm/vllm-openai:v{v}",
    "cuda-variant": "vllm/vllm-openai:v{v}-cu130",
    "release-candidate": "vllm/vllm-openai:v{v}rc1",
    "digest": "vllm/vllm-openai@sha256:" + "0" * 64,
}

# The CRD's space, one axis a line. Methods with a drafter checkpoint use the paired DSpark
# repository, whose config the static stage knows (others are the probe's to judge).
AXES: dict[str, Sequence[Any]] = {
    "architecture": (
        "KimiLinearForCausalLM",
        "KimiK3ForConditionalGeneration",
        "KimiK31ForConditionalGeneration",
        *GQA_ARCHITECTURES,
    ),
    "platform": ("nvidia", "amd"),
    "method": ("dspark", "eagle3", "dflash", "mtp", "ngram", "none"),
    "tokens": (None, 3, 8),
    "parallel": ((8, 1), (16, 1), (8, 2), (12, 1), (16, 2)),
    "decode_context": (1, 2, 4, 8),
    "expert": (False, True),
    "kv_cache_dtype": ("fp8", "auto", "fp8_e4m3", "fp8_e5m2", "bfloat16"),
    "samples": (("probabilistic", "block"), ("greedy", "standard")),
    "max_model_len": (32768, 2_000_000),
    "drafter_config": tuple(DRAFTER_VARIANTS),
    "extra_args": tuple(EXTRA_ARGS),
    "tag": tuple(TAGS),
}


def spec_of(point: Mapping[str, Any]) -> dict[str, Any]:
    tensor, pipeline = point["parallel"]
    drafter: dict[str, Any] = {"method": point["method"]}
    if uses_drafter_config(point):
        drafter["repo"] = DRAFTER_VARIANTS[point.get("drafter_config", "published")][0]
    if point["tokens"] is not None and point["method"] != "none":
        drafter["numSpeculativeTokens"] = point["tokens"]
    if point["method"] in ("dspark", "eagle3", "dflash", "draft_model"):
        drafter["draftSampleMethod"], drafter["rejectionSampleMethod"] = point["samples"]
    model: dict[str, Any] = {"architecture": point["architecture"]}
    if point["architecture"] in GQA_ARCHITECTURES:
        model["config"] = json.dumps(target_config(point["architecture"]))
    return {
        "model": model,
        "drafter": drafter,
        "engine": {
            "platform": point["platform"],
            "maxModelLen": point["max_model_len"],
            "kvCacheDtype": point["kv_cache_dtype"],
            "extraArgs": list(EXTRA_ARGS[point.get("extra_args", "none")]),
        },
        "parallelism": {
            "tensor": tensor,
            "pipeline": pipeline,
            "decodeContext": point["decode_context"],
            "expert": point["expert"],
        },
        "placement": {"gpusPerNode": 8},
    }


def space() -> Iterator[dict[str, Any]]:
    names = list(AXES)
    for values in itertools.product(*(AXES[n] for n in names)):
        yield dict(zip(names, values, strict=True))


def space_size() -> int:
    return math.prod(len(values) for values in AXES.values())


def point_at(index: int) -> dict[str, Any]:
    """The index-th point of space(), without enumerating the ones before it."""
    point: dict[str, Any] = {}
    for name in reversed(list(AXES)):
        index, digit = divmod(index, len(AXES[name]))
        point[name] = AXES[name][digit]
    return {name: point[name] for name in AXES}


def sample_points(size: int, seed: int) -> list[dict[str, Any]]:
    """``size`` distinct points drawn at random (every point when the space is no larger)."""
    total = space_size()
    if size <= 0 or size >= total:
        return list(space())
    return [point_at(i) for i in random.Random(seed).sample(range(total), size)]


def kind_of(point: Mapping[str, Any]) -> str:
    pipeline = point["parallel"][1]
    parallel = "pp" if pipeline > 1 else "dcp" if point["decode_context"] > 1 else "tp"
    attention = "gqa/" if point["architecture"] in GQA_ARCHITECTURES else ""
    variant = point.get("drafter_config", "published")
    read = f"/{variant}" if variant != "published" and uses_drafter_config(point) else ""
    extra = point.get("extra_args", "none")
    args = f"/args={extra}" if extra != "none" else ""
    return f"{attention}{point['method']}/{parallel}{read}{args}"


def image_of(point: Mapping[str, Any], version: str) -> str:
    return TAGS[point.get("tag", "release")].format(v=version)


def uses_drafter_config(point: Mapping[str, Any]) -> bool:
    return point["method"] in ("dspark", "eagle3", "dflash")


def drafter_config(point: Mapping[str, Any]) -> dict[str, Any]:
    """The drafter's config.json for the point's variant."""
    return dict(DRAFTER_VARIANTS[point.get("drafter_config", "published")][1])


@dataclass(frozen=True)
class Static:
    verdict: str  # Pass, Fail, NeedsProbe
    reasons: tuple[str, ...]


def static_verdict(
    spec: Mapping[str, Any],
    version: str,
    drafter: Mapping[str, Any] | None = None,
    image: str | None = None,
) -> Static | None:
    """The static stage's verdict on the spec for ``version`` (in ``image``, by default the
    release's tag), with the drafter's config.json read when ``drafter`` is given; None: the
    spec is unreadable (the CRD or the operator refuses it before any preflight)."""
    data = json.loads(json.dumps(spec))
    data["engine"]["image"] = image or f"vllm/vllm-openai:v{version}"
    try:
        parsed = parse_spec(data)
    except SpecError:
        return None
    # As the operator judges it: the configs the spec gives (spec.model.config), and the
    # drafter's config.json where it is read.
    facts = given_facts(parsed, load_table())
    if drafter is not None:
        facts = dataclasses.replace(
            facts, drafter=drafter_facts(drafter, "the drafter's config.json")
        )
    findings = run_rules(parsed, facts)
    failed = tuple(sorted({str(f.reason) for f in findings if f.status == "Fail"}))
    if failed:
        return Static("Fail", failed)
    unknown = tuple(sorted({str(f.reason) for f in findings if f.status == "Unknown"}))
    return Static("NeedsProbe", unknown) if unknown else Static("Pass", ())


def case_of(
    case_id: str,
    spec: Mapping[str, Any],
    version: str,
    config: Mapping[str, Any] = DSPARK_CONFIG,
) -> dict[str, Any]:
    """What vLLM is asked for a spec: the leader's line, the target's config.json and, for a
    drafter checkpoint, ``config`` as its config.json."""
    data = json.loads(json.dumps(spec))
    data["engine"]["image"] = f"vllm/vllm-openai:v{version}"
    parsed = parse_spec(data)
    drafter = parsed.paired_drafter
    return {
        "id": case_id,
        "argv": expanded_serve_args(parsed, drafter, "leader"),
        "platform": parsed.engine.platform,
        "targetConfig": target_config(parsed.model.architecture),
        "drafterConfig": dict(config) if drafter is not None and drafter.repo else None,
    }


CACHE = pathlib.Path.home() / ".cache" / "kimik3-operator"
OVERLAY_HOST = "0.33.0"  # the venv whose dependencies an overlay runs on


def release_python(version: str) -> tuple[str, dict[str, str]] | None:
    """The release's python and its environment: its own venv, or its Python sources
    (scripts/vllm-overlay.sh) over the 0.33.0 venv's dependencies."""
    explicit = os.environ.get(f"KIMIK3_VLLM_PYTHON_{version.replace('.', '_')}")
    if explicit:
        return explicit, {}
    own = CACHE / f"vllm-{version}" / "bin" / "python"
    if own.exists():
        return str(own), {}
    overlay, host = CACHE / f"vllm-overlay-{version}", CACHE / f"vllm-{OVERLAY_HOST}"
    if (overlay / "vllm").is_dir() and (host / "bin" / "python").exists():
        return str(host / "bin" / "python"), {"PYTHONPATH": str(overlay)}
    return None


# Runs ``python SCRIPT ARG...`` in vLLM's venv with this environment over the process's,
# raising when it fails: how the tests run it in a fork of a process that imported vLLM.
Runner = Callable[[list[str], Mapping[str, str]], None]


def ask_vllm(
    python: str,
    cases: Sequence[Mapping[str, Any]],
    env: Mapping[str, str] | None = None,
    run: Runner | None = None,
) -> dict[str, dict[str, Any]]:
    """vLLM's verdicts, one process per platform (the platform is set once a process)."""
    answers: dict[str, dict[str, Any]] = {}
    script = pathlib.Path(probe_script.__file__)
    with tempfile.TemporaryDirectory() as work:
        for platform in sorted({c["platform"] for c in cases}):
            batch = [c for c in cases if c["platform"] == platform]
            asked, told = pathlib.Path(work) / "cases.json", pathlib.Path(work) / "answers.json"
            asked.write_text(json.dumps(batch))
            argv = [str(script), "--differential", str(asked), str(told)]
            if run is not None:
                run(argv, env or {})
            else:
                subprocess.run(
                    [python, *argv],
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", **(env or {})},
                )
            answers.update({a["id"]: a for a in json.loads(told.read_text())})
    return answers


@dataclass(frozen=True)
class Outcome:
    case: str
    kind: str
    point: str
    static: Static
    vllm_ok: bool
    vllm_error: str
    later: frozenset[str] = DECIDED_LATER

    @property
    def verdict(self) -> str:
        """agree, rule bug, false alarm, earlier (refused before vLLM would), or skipped."""
        if self.static.verdict == "NeedsProbe":
            return "probe"
        if self.static.verdict == "Pass":
            return "agree" if self.vllm_ok else "rule bug"
        if not self.vllm_ok:
            return "agree"
        return "earlier" if set(self.static.reasons) <= self.later else "false alarm"


def compare(
    version: str,
    python: str,
    points: Sequence[Mapping[str, Any]],
    env: Mapping[str, str] | None = None,
    run: Runner | None = None,
) -> tuple[list[Outcome], int]:
    """The outcome of every readable spec, and how many the CRD or the operator refuses."""
    statics: dict[str, Static] = {}
    cases: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}
    described: dict[str, str] = {}
    later: dict[str, frozenset[str]] = {}
    unreadable = 0
    for number, point in enumerate(points):
        spec = spec_of(point)
        read = point.get("drafter_config", "published") != "published" and uses_drafter_config(
            point
        )
        config = drafter_config(point)
        static = static_verdict(spec, version, config if read else None, image_of(point, version))
        if static is None:
            unreadable += 1
            continue
        case_id = str(number)
        statics[case_id], kinds[case_id] = static, kind_of(point)
        later[case_id] = decided_later(point, version)
        described[case_id] = " ".join(f"{k}={v}" for k, v in point.items())
        cases.append(case_of(case_id, spec, version, config))
    answers = ask_vllm(python, cases, env, run)
    outcomes = [
        Outcome(
            case_id,
            kinds[case_id],
            described[case_id],
            statics[case_id],
            bool(answers.get(case_id, {}).get("ok")),
            str(answers.get(case_id, {}).get("error", "")),
            later[case_id],
        )
        for case_id in statics
    ]
    return outcomes, unreadable


def report(version: str, outcomes: Sequence[Outcome], unreadable: int) -> dict[str, Any]:
    counts = collections.Counter(o.verdict for o in outcomes)
    compared = sum(v for k, v in counts.items() if k != "probe")
    agreeing = counts["agree"] + counts["earlier"]
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for outcome in outcomes:
        by_kind[outcome.kind][outcome.verdict] += 1
    return {
        "release": version,
        "specs": len(outcomes) + unreadable,
        "unreadable": unreadable,
        "compared": compared,
        "agreement": round(agreeing / compared, 4) if compared else None,
        "counts": dict(sorted(counts.items())),
        "byKind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
        "disagreements": [
            {
                "kind": o.kind,
                "spec": o.point,
                "verdict": o.verdict,
                "static": o.static.verdict,
                "reasons": list(o.static.reasons),
                "vllm": o.vllm_error[:300] or "accepted",
            }
            for o in outcomes
            if o.verdict in ("rule bug", "false alarm")
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", action="append", help="a release (default: every one)")
    parser.add_argument("--sample", type=int, default=0, help="random specs (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write", action="store_true", help=f"record in {RECORD.name}")
    args = parser.parse_args()
    versions = args.release or [format_version(v) for v in load_table().releases]
    points = sample_points(args.sample, args.seed)
    print(f"space: {space_size()} specs; asking about {len(points)} per release")
    results = []
    for version in versions:
        found = release_python(version)
        if found is None:
            print(f"{version}: no venv and no overlay (bash scripts/vllm-overlay.sh {version})")
            continue
        python, env = found
        outcomes, unreadable = compare(version, python, points, env)
        result = report(version, outcomes, unreadable)
        results.append(result)
        print(
            f"{version}: {result['compared']} compared, agreement {result['agreement']}, "
            f"{result['counts']}, {unreadable} refused by the schema or the operator"
        )
        for kind, counts in result["byKind"].items():
            print(f"  {kind:<16} {counts}")
        for item in result["disagreements"]:
            print(f"  {item['verdict']}: {item['kind']} static {item['static']} {item['reasons']}")
            print(f"    spec: {item['spec']}")
            print(f"    vLLM: {item['vllm']}")
    if args.write:
        # Per release: a run of some releases replaces theirs and keeps the others'.
        kept = json.loads(RECORD.read_text()).get("releases", []) if RECORD.exists() else []
        ran = {r["release"] for r in results}
        merged = sorted(
            [r for r in kept if r["release"] not in ran] + results,
            key=lambda r: [int(part) for part in r["release"].split(".")],
        )
        record = {"space": space_size(), "sample": len(points), "seed": args.seed}
        RECORD.write_text(json.dumps({**record, "releases": merged}, indent=1) + "\n")
        print(f"wrote {RECORD}")


if __name__ == "__main__":
    main()
