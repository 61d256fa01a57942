"""The inventory of vLLM's refusals on the way to the first weight byte, per release, read
from the wheels' source (no import): ``python -m kimik3_operator.preflight.refusals``.

Every ``raise`` and ``assert`` in the modules ``vllm serve`` runs before it reads a weight
(argument parsing, the engine's configuration, the config classes of the target's and
drafters' model types, the model registry and interfaces, the platforms, the speculative
proposers, the Kimi-K3 and drafter model classes) is a site. Each site is mapped to where
the preflight meets it:

- ``rule``: a static rule refuses the same thing (the reason is named);
- ``probe``: the image probe runs the code that holds it, in the exact image (``parse``:
  the image's own ``vllm serve`` parser; ``engine``: ``EngineArgs`` and ``VllmConfig`` from
  the leader's command line; ``construct``: the model classes built on the meta device);
- ``device``: before the weights, but only on the GPU worker (the platform's own hooks, the
  proposer the model runner builds on its device), out of the probe's reach;
- ``after-weights``: reached only once weights are read or requests served.

A site no mapping covers is ``unmapped``; the table's test fails on one, so a new release's
new site is mapped before the release is added to the capability table.
"""

from __future__ import annotations

import ast
import hashlib
import json
import pathlib
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from kimik3_operator.api.constants import Reason
from kimik3_operator.preflight.generate import Wheel, download, wheels_parser

TABLE_PATH: Final = pathlib.Path(__file__).resolve().parents[1] / "data" / "refusals.json"
STAGES: Final = ("rule", "probe", "device", "after-weights", "unmapped")

# Where the start-up path before the first weight runs: a file under one of these is in the
# inventory, and a file no rule of FILES places is unmapped.
WATCHED: Final = re.compile(
    r"vllm/(models/kimi_k3/|v1/spec_decode/|v1/worker/gpu/spec_decode/|config/|"
    r"entrypoints/(openai|common|launchers)/cli_args\.py|entrypoints/cli/serve\.py|"
    r"engine/arg_utils\.py|utils/argparse_utils\.py|transformers_utils/config\.py|"
    r"transformers_utils/configs/(eagle|k3_dspark|kimi_k3|kimi_linear|speculators/)|"
    r"model_executor/models/(registry|interfaces|llama_eagle3|deepseek_eagle3|qwen3_dspark|"
    r"kimi_linear)\.py|platforms/(__init__|interface|cuda|rocm|cpu)\.py)"
)
# What each file does on that path (the first match): parse, engine (configuration and the
# registry), platform, speculator (Model Runner V2's, which the probe builds), proposer (the
# V1 runner's, built inside the runner on the GPU), model (the classes constructed), kernel
# (runs on the device once the weights are there).
FILES: Final[tuple[tuple[str, str], ...]] = (
    (r"vllm/(entrypoints/.*|utils/argparse_utils)\.py", "parse"),
    (r"vllm/(engine/arg_utils|config/.*|transformers_utils/.*)\.py", "engine"),
    (r"vllm/model_executor/models/(registry|interfaces)\.py", "engine"),
    (r"vllm/models/kimi_k3/((nvidia|amd|common)/)?__init__\.py", "engine"),
    (r"vllm/platforms/(cuda|rocm)\.py", "gpu-platform"),
    (r"vllm/platforms/.*\.py", "platform"),
    (r"vllm/v1/worker/gpu/spec_decode/.*\.py", "speculator"),
    (r"vllm/v1/spec_decode/.*\.py", "proposer"),
    (r"vllm/model_executor/models/.*\.py", "model"),
    (
        r"vllm/models/kimi_k3/(nvidia|amd|common)/(model|mtp|dspark_mla|dense_draft|gqa_draft|"
        r"kda|mla|dsa|linear|latent_moe_runner|low_latency_gemm|index_rope)\.py",
        "model",
    ),
    # The decode runtime's configuration is read while the model is constructed.
    (r"vllm/models/kimi_k3/(nvidia|amd|common)/specialized_decode/runtime/__init__\.py", "model"),
    (
        r"vllm/models/kimi_k3/(nvidia|amd|common)/(kda_metadata|model_state|dsa_cache|"
        r"mm_preprocess|(ops|recoverssm|specialized_decode|kv_balanced_mla)/.*)\.py",
        "kernel",
    ),
)


# Functions a model or proposer runs once it has weights or requests.
RUNTIME_FUNCTIONS: Final = re.compile(
    r"(^|\.)(forward|_forward\w*|compute_logits|load_weights|_load\w*|propose\w*|"
    r"prepare\w*|sample\w*|combine_hidden_states|get_input_embeddings|embed_\w+|"
    r"dummy_run|capture\w*|run\w*|update\w*|build\w*|process_weights\w*|"
    r"set_aux_hidden_state_layers|get_eagle3_aux\w*|make_empty\w*|_\w*kernel\w*)$"
)


@dataclass(frozen=True)
class Mapping:
    stage: str
    detail: str
    why: str


# Sites whose refusal a static rule makes too: (message fragment, the rule's reason).
RULE_SITES: Final[tuple[tuple[str, Reason], ...]] = (
    ("DSpark does not support pipeline parallelism", Reason.DSPARK_REFUSES_PIPELINE_PARALLEL),
    ("does not currently support decode context", Reason.DSPARK_REFUSES_DECODE_CONTEXT_PARALLEL),
    ("draft_vocab_size to equal vocab_size", Reason.DRAFTER_VOCABULARY_MISMATCH),
    ("non-empty target_layer_ids", Reason.DRAFTER_TARGET_LAYERS_INVALID),
    ("must be divisible by tensor parallel size", Reason.TENSOR_SIZE_DOES_NOT_DIVIDE_HEADS),
    ("Decode context parallelism for GQA/MQA requires", Reason.DECODE_CONTEXT_EXCEEDS_KV_HEADS),
    ("exceeds the maximum supported value", Reason.DECODE_CONTEXT_EXCEEDS_KV_HEADS),
    ("query heads per KV head", Reason.DECODE_CONTEXT_EXCEEDS_KV_HEADS),
    ("when expert parallelism is enabled", Reason.EXPERT_PARALLEL_WITHOUT_EXPERTS),
    ("not divisible by n_predict", Reason.SPECULATIVE_TOKENS_NOT_DIVISIBLE),
    ("num_speculative_tokens must be provided", Reason.SPECULATIVE_TOKENS_REQUIRED),
)


# Where each phase's sites are met: (the phase's, a runtime function's where it differs).
PLACES: Final[dict[str, tuple[Mapping, Mapping | None]]] = {
    "parse": (
        Mapping("probe", "parse", "the probe parses the leader's and workers' lines"),
        None,
    ),
    "engine": (
        Mapping(
            "probe", "engine", "the probe builds EngineArgs and VllmConfig, which ask the registry"
        ),
        None,
    ),
    "platform": (
        Mapping(
            "probe",
            "platform",
            "platform resolution and the base platform's checks run in the probe's image",
        ),
        None,
    ),
    "gpu-platform": (
        Mapping(
            "device",
            "platform",
            "the GPU platform's hooks ask the device, which the probe's CPU node lacks",
        ),
        None,
    ),
    "proposer": (
        Mapping(
            "device",
            "proposer",
            "the V1 model runner builds its proposer in its own constructor, on the GPU worker",
        ),
        Mapping("after-weights", "proposer", "drafting runs on requests"),
    ),
    "speculator": (
        Mapping(
            "probe",
            "proposer",
            "the probe builds Model Runner V2's speculator with vLLM's init_speculator on the "
            "meta device",
        ),
        Mapping("after-weights", "proposer", "drafting runs on requests"),
    ),
    "kernel": (
        Mapping(
            "after-weights",
            "kernel",
            "kernels, caches and decode runtimes run on the device with the weights loaded",
        ),
        None,
    ),
    "model": (
        Mapping("probe", "construct", "the probe constructs the models on the meta device"),
        Mapping("after-weights", "model", "runs with the weights loaded"),
    ),
}
CPU_PLATFORM: Final = Mapping("probe", "engine", "a CPU image's own platform answers the probe")
UNMAPPED: Final = Mapping("unmapped", "", "no rule of refusals.FILES places this file")


def map_site(phase: str, function: str, text: str) -> Mapping:
    """Where the preflight meets a refusal at ``function`` (its qualified name) in a file of
    ``phase`` (FILES' phases), saying ``text``."""
    for fragment, reason in RULE_SITES:
        if fragment in text:
            return Mapping("rule", reason.value, "the static rule refuses the same")
    if phase == "platform" and function.startswith("Cpu"):
        return CPU_PLATFORM
    if phase not in PLACES:
        return UNMAPPED
    place, runtime = PLACES[phase]
    return runtime if runtime is not None and RUNTIME_FUNCTIONS.search(function) else place


@dataclass(frozen=True)
class Site:
    file: str
    function: str
    line: int
    text: str
    phase: str

    @property
    def key(self) -> str:
        """Stable across releases: where and what, not the line."""
        digest = hashlib.sha256(f"{self.file}|{self.function}|{self.text}".encode()).hexdigest()
        return digest[:12]


def _text(node: ast.Raise | ast.Assert) -> str:
    if isinstance(node, ast.Assert):
        said = ast.unparse(node.test)
        if node.msg is not None:
            said += ", " + ast.unparse(node.msg)
        return ("assert " + said)[:160]
    return ("raise " + ast.unparse(node.exc) if node.exc is not None else "raise")[:160]


def _sites(tree: ast.Module) -> Iterator[tuple[str, int, str]]:
    """(qualified function, line, text) of every raise and assert, with the function that
    holds it (``<module>`` at the top)."""

    def walk(node: ast.AST, scope: str) -> Iterator[tuple[str, int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope != "<module>" else child.name
                yield from walk(child, inner)
                continue
            if isinstance(child, ast.Raise) and child.exc is None:
                continue  # a re-raise: the refusal is the one it re-raises
            if isinstance(child, (ast.Raise, ast.Assert)):
                yield scope, child.lineno, _text(child)
            yield from walk(child, scope)

    yield from walk(tree, "<module>")


def file_phase(name: str) -> str | None:
    """The file's phase on the start-up path, "unmapped" for a watched file no rule places,
    None for a file off the path."""
    if not WATCHED.match(name) or not name.endswith(".py"):
        return None
    return next((phase for rx, phase in FILES if re.fullmatch(rx, name)), "unmapped")


def release_sites(wheel: Wheel) -> list[Site]:
    found = []
    for name in sorted(wheel.names):
        phase = file_phase(name)
        if phase is None:
            continue
        try:
            tree = ast.parse(wheel.read(name) or "")
        except SyntaxError:
            continue
        for function, line, text in _sites(tree):
            found.append(Site(name, function, line, text, phase))
    return found


def inventory(releases: dict[str, list[Site]]) -> dict[str, object]:
    """The table: each site once (file, function, what it says, stage, detail), each release
    its counts and its sites with their lines; the reasons, once per detail."""
    sites: dict[str, list[str]] = {}
    why: dict[str, str] = {}
    per_release: dict[str, object] = {}
    for version, found in releases.items():
        counts: Counter[str] = Counter()
        keys = []
        for site in found:
            mapping = map_site(site.phase, site.function, site.text)
            counts[mapping.stage] += 1
            sites[site.key] = [site.file, site.function, site.text, mapping.stage, mapping.detail]
            why[f"{mapping.stage}/{mapping.detail}"] = mapping.why
            keys.append(f"{site.key}:{site.line}")
        per_release[version] = {
            "sites": len(found),
            "counts": {stage: counts[stage] for stage in STAGES},
            "lines": keys,
        }
    return {
        "schema": 1,
        "generatedBy": "python -m kimik3_operator.preflight.refusals",
        "watched": WATCHED.pattern,
        "why": dict(sorted(why.items())),
        "releases": per_release,
        "sites": dict(sorted(sites.items())),
    }


def summary(table: dict[str, object]) -> list[str]:
    """One line per release: the counts the README prints."""
    releases = table["releases"]
    assert isinstance(releases, dict)
    lines = []
    for version, entry in releases.items():
        counts = entry["counts"]
        lines.append(
            f"{version}: {entry['sites']} sites: "
            + ", ".join(f"{stage} {counts[stage]}" for stage in STAGES)
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = wheels_parser(__doc__, TABLE_PATH).parse_args(argv)
    args.wheels.mkdir(parents=True, exist_ok=True)
    releases = {v: release_sites(Wheel(download(v, args.wheels))) for v in args.versions}
    table = inventory(releases)
    args.output.write_text(
        json.dumps(table, indent=0, separators=(",", ":"), sort_keys=True) + "\n"
    )
    print("\n".join(summary(table)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
