"""Generates the capability table from the released vLLM wheels, reading their source
statically (no vLLM import, no GPU): ``python -m kimik3_operator.preflight.generate``.

For each release it records which Kimi-K3 architectures the registry maps to the Kimi-K3
package, and for each architecture and platform which protocols its class declares, whether
the inner decoder carries the EAGLE3 machinery and can pass aux hidden states over pipeline
stages, where the drafters are implemented, which parallelism DSpark refuses, and what each
speculative method does to a drafter's architecture (``drafter_methods``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import pathlib
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from typing import Any, Final

from kimik3_operator.api.types import GQA_ARCHITECTURES, TARGET_ARCHITECTURES
from kimik3_operator.preflight.drafter_methods import (
    acceptance_by_platform,
    extract_methods,
    method_names,
    speculative_architectures,
)
from kimik3_operator.preflight.serve_flags import serve_flags
from kimik3_operator.programs.probe import (
    AUX_PP_CHECK,
    DRAFT_EP_INHERIT,
    DSPARK_DCP_REFUSAL,
    DSPARK_PP_REFUSAL,
    K3_PACKAGE,
    module_file,
    platform_imports,
)

DRAFTER_ARCHITECTURES: Final = ("K3DSparkModel", "KimiK3MTPModel")
# Through 0.29.0 the draft's parallel config takes the target's pipeline size, and no drafter
# class declares SupportsPP: the draft model's config refuses pipeline parallelism.
DRAFT_PP_INHERIT: Final = "pipeline_parallel_size=target_parallel_config.pipeline_parallel_size"
PROTOCOLS: Final = {
    "SupportsEagle3": "supportsEagle3",
    "SupportsPP": "supportsPipelineParallel",
    "IsHybrid": "isHybrid",
    "SupportsMultiModal": "multimodal",
}
RELEASES: Final = (
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
TABLE_PATH: Final = pathlib.Path(__file__).resolve().parents[1] / "data" / "capabilities.json"
# Where the wheels are kept once downloaded (the vllm tier reads them from there too).
WHEELS: Final = pathlib.Path.home() / ".cache" / "kimik3-operator" / "wheels"


class Wheel:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self.names = set(self._zip.namelist())

    def read(self, name: str) -> str | None:
        return self._zip.read(name).decode("utf-8") if name in self.names else None

    def sha256(self) -> str:
        digest = hashlib.sha256()
        with open(self.path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()


def registry_entries(source: str) -> dict[str, tuple[str, str]]:
    """Architecture -> (module, class) for the architectures the table tracks."""
    wanted = set(TARGET_ARCHITECTURES) | set(GQA_ARCHITECTURES) | set(DRAFTER_ARCHITECTURES)
    found: dict[str, tuple[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and key.value in wanted
                and isinstance(value, ast.Tuple)
                and len(value.elts) == 2
                and all(isinstance(e, ast.Constant) for e in value.elts)
            ):
                module, cls = (e.value for e in value.elts)  # type: ignore[attr-defined]
                found[str(key.value)] = (str(module), str(cls))
    return found


def _base_names(cls: ast.ClassDef) -> list[str]:
    names = []
    for base in cls.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _inner_model_class(cls: ast.ClassDef) -> str | None:
    """The class assigned to ``self.model`` in __init__ (the inner decoder), directly or
    through a method of the class that returns it (Llama's ``self._init_model``)."""
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and ast.unparse(node.targets[0]) == "self.model"
            and isinstance(node.value, ast.Call)
        ):
            func = node.value.func
            if isinstance(func, ast.Name):
                return func.id
            if isinstance(func, ast.Attribute) and ast.unparse(func.value) == "self":
                return _returned_class(cls, func.attr)
    return None


def _returned_class(cls: ast.ClassDef, method: str) -> str | None:
    found = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method), None)
    for node in ast.walk(found) if found is not None else ():
        if (
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
        ):
            return node.value.func.id
    return None


def _sets_true(cls: ast.ClassDef, attribute: str) -> bool:
    for stmt in cls.body:
        targets = (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else ([stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
        )
        for target in targets:
            value = getattr(stmt, "value", None)
            if (
                isinstance(target, ast.Name)
                and target.id == attribute
                and isinstance(value, ast.Constant)
                and value.value is True
            ):
                return True
    return False


def class_capabilities(wheel: Wheel, file: str, name: str) -> dict[str, Any]:
    source = wheel.read(file)
    if source is None:
        return {"module": file, "class": name, "found": False}
    tree = ast.parse(source)
    cls = _find_class(tree, name)
    if cls is None:
        return {"module": file, "class": name, "found": False}
    bases = set(_base_names(cls))
    info: dict[str, Any] = {"module": file, "class": name, "found": True}
    info.update({field: protocol in bases for protocol, field in PROTOCOLS.items()})
    inner_name = _inner_model_class(cls)
    inner = _find_class(tree, inner_name) if inner_name else None
    info["innerModel"] = inner_name
    info["innerEagleMixin"] = inner is not None and "EagleModelMixin" in _base_names(inner)
    info["innerAuxHiddenStatesOverPP"] = inner is not None and _sets_true(
        inner, "supports_aux_hidden_states_over_pp"
    )
    return info


# The NIXL connector's refusals at start-up or at the first handshake, by their messages.
NIXL_PACKAGE: Final = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/"
NIXL_PIPELINE_HYBRID: Final = (
    "with hybrid KV cache layouts (HMA) yet",
    "with Mamba/SSM hybrid KV cache layouts yet",
)
NIXL_DECODE_PIPELINE: Final = "consumer (decode) does not support"
NIXL_DRAFT_TP_DIRECTION: Final = "head-sharded draft KV under an MLA target requires"
NIXL_HYBRID_DCP: Final = "require matching DCP sizes"
NIXL_SPECULATIVE_HASH: Final = "_get_speculative_compatibility_factors"


def kv_transfer_facts(wheel: Wheel) -> dict[str, Any]:
    """What a release's KV connectors do with a prefill/decode pair, read from its source."""
    factory = wheel.read("vllm/distributed/kv_transfer/kv_connector/factory.py") or ""
    connectors = []
    for node in ast.walk(ast.parse(factory)):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("register_connector")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            connectors.append(str(node.args[0].value))
    nixl = "".join(
        wheel.read(name) or ""
        for name in sorted(wheel.names)
        if name.startswith(NIXL_PACKAGE) and name.endswith(".py")
    )
    version = None
    for node in ast.walk(ast.parse(nixl)) if nixl else ():
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = getattr(node, "value", None)
        if [ast.unparse(t) for t in targets] == ["NIXL_CONNECTOR_VERSION"] and isinstance(
            value, ast.Constant
        ):
            version = value.value
    hma = False
    for node in ast.walk(ast.parse(nixl)) if nixl else ():
        if isinstance(node, ast.ClassDef) and node.name in ("NixlConnector", "NixlBaseConnector"):
            hma = hma or "SupportsHMA" in _base_names(node)
    arg_utils = wheel.read("vllm/engine/arg_utils.py") or ""
    envs = wheel.read("vllm/envs.py") or ""
    return {
        "connectors": sorted(connectors),
        "nixl": {
            "connectorVersion": version,
            "supportsHybridKvCacheManager": hma,
            "hashesSpeculativeConfig": NIXL_SPECULATIVE_HASH in nixl,
            "refusesPipelineWithHybrid": any(m in nixl for m in NIXL_PIPELINE_HYBRID),
            "refusesDecodePipeline": NIXL_DECODE_PIPELINE in nixl,
            "draftNeedsDecodeTensorAtLeastPrefill": NIXL_DRAFT_TP_DIRECTION in nixl,
            "hybridNeedsMatchingDecodeContext": NIXL_HYBRID_DCP in nixl,
        },
        "hybridKvCacheManagerFlag": "disable_hybrid_kv_cache_manager" in arg_utils,
        "ssmConvStateLayoutEnv": "VLLM_SSM_CONV_STATE_LAYOUT" in envs,
    }


def dspark_config_refusals(source: str) -> list[str]:
    """What vLLM's K3DSparkConfig refuses in a drafter's config.json ("MLA DSpark does not
    support ..."): the flags it refuses when set, and ``field=None`` for a field it refuses
    when null, in the order it names them."""
    cls = _find_class(ast.parse(source), "K3DSparkConfig") if source else None
    if cls is None:
        return []
    found: list[str] = []
    for node in ast.walk(cls):
        # for name in ("mla_use_nope", ...) if getattr(self, name, False)
        if isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Tuple):
            found += [str(e.value) for e in node.iter.elts if isinstance(e, ast.Constant)]
        # unsupported.append("q_lora_rank=None")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).endswith("=None")
        ):
            found.append(str(node.args[0].value))
    return [str(name) for name in dict.fromkeys(found)]


def parallel_drafting_tokens(source: str) -> list[str]:
    """The config.json fields Model Runner V2's parallel drafting (DSpark's and DFlash's
    speculators) takes the token of its draft slots from, in the order it tries them
    (``get_parallel_drafting_token_id``); a nested ``dflash_config`` field as
    "dflash_config.<field>". Empty: the release has no such function."""
    tree = ast.parse(source) if source else None
    function = (
        next(
            (
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef) and n.name == "get_parallel_drafting_token_id"
            ),
            None,
        )
        if tree is not None
        else None
    )
    if function is None:
        return []
    # (line, column, field): vLLM tries the fields in the order it names them.
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(function):
        # getattr(hf_config, "x", ...) / hasattr(hf_config, "x")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and ast.unparse(node.args[0]) == "hf_config"
        ):
            found.append((node.lineno, node.col_offset, node.args[1].value))
        # "mask_token_id" in dflash_config
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.In)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)
            and isinstance(node.comparators[0], ast.Name)
        ):
            name = f"{node.comparators[0].id}.{node.left.value}"
            found.append((node.lineno, node.col_offset, name))
    # "dflash_config" itself is the holder of a nested field, not a token.
    return list(dict.fromkeys(name for *_, name in sorted(found) if name != "dflash_config"))


def dspark_token_fields(speculative: str, dspark_config: str) -> list[str]:
    """The drafter config.json fields a release's dspark takes num_speculative_tokens from
    when the spec leaves it unset (``block_size``, then ``dspark_block_size``), in the order
    it tries them: in SpeculativeConfig's ``if self.use_dspark():`` branch, or (Model Runner
    V2's) the DSpark speculator config's. Empty: dspark takes n_predict like the others."""
    scopes: list[list[ast.stmt]] = []
    for node in ast.walk(ast.parse(speculative)) if speculative else ():
        if isinstance(node, ast.If) and "use_dspark" in ast.unparse(node.test):
            scopes.append(node.body)
    for node in ast.walk(ast.parse(dspark_config)) if dspark_config else ():
        if isinstance(node, ast.FunctionDef):
            scopes.append(node.body)
    found: list[str] = []
    for body in scopes:
        assigns = [n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Assign)]
        taken = {
            a.value.id
            for a in assigns
            if ast.unparse(a.targets[0]).endswith(".num_speculative_tokens")
            and isinstance(a.value, ast.Name)
        }
        found += [
            str(a.value.args[1].value)
            for a in assigns
            if isinstance(a.targets[0], ast.Name)
            and a.targets[0].id in taken
            and isinstance(a.value, ast.Call)
            and ast.unparse(a.value.func) == "getattr"
            and len(a.value.args) >= 2
            and isinstance(a.value.args[1], ast.Constant)
        ]
    return list(dict.fromkeys(found))


def release_capabilities(wheel: Wheel) -> dict[str, Any]:
    registry = wheel.read("vllm/model_executor/models/registry.py") or ""
    entries = registry_entries(registry)
    k3_init = wheel.read(module_file(K3_PACKAGE, package=True)) or ""
    per_platform = platform_imports(k3_init, K3_PACKAGE) if k3_init else {}
    architectures: dict[str, Any] = {}
    for arch in TARGET_ARCHITECTURES:
        if arch not in entries:
            continue
        module, cls = entries[arch]
        serves_k3 = module == K3_PACKAGE or module.startswith(K3_PACKAGE + ".")
        platforms = {}
        if serves_k3:
            for platform in ("nvidia", "amd"):
                file = (
                    per_platform.get(platform, {}).get(cls)
                    if module == K3_PACKAGE
                    else (module_file(module))
                )
                if file is not None:
                    caps = class_capabilities(wheel, file, cls)
                    text = per_platform.get(platform, {}).get("KimiLinearForCausalLM")
                    if caps.get("multimodal") and text is not None:
                        # The multimodal class runs the registered text class inside it.
                        text_caps = class_capabilities(wheel, text, "KimiLinearForCausalLM")
                        caps["innerModel"] = text_caps["innerModel"]
                        caps["innerEagleMixin"] = text_caps["innerEagleMixin"]
                        caps["innerAuxHiddenStatesOverPP"] = text_caps["innerAuxHiddenStatesOverPP"]
                    platforms[platform] = caps
        architectures[arch] = {
            "registeredAs": [module, cls],
            "servesKimiK3": serves_k3,
            "platforms": platforms,
        }
    for arch in GQA_ARCHITECTURES:
        if arch in entries:
            # One module for every platform: the model_executor's own.
            module, cls = entries[arch]
            caps = class_capabilities(wheel, module_file(module), cls)
            architectures[arch] = {
                "registeredAs": [module, cls],
                "servesKimiK3": False,
                "attention": "gqa",
                "platforms": {platform: caps for platform in ("nvidia", "amd")},
            }
    drafters: dict[str, Any] = {}
    for drafter_arch in DRAFTER_ARCHITECTURES:
        if drafter_arch not in entries:
            continue
        module, cls = entries[drafter_arch]
        if module == K3_PACKAGE:
            platforms_list = sorted(p for p, names in per_platform.items() if cls in names)
        else:
            platforms_list = [p for p in ("nvidia", "amd") if f".{p}." in module + "."] or [
                "nvidia",
                "amd",
            ]
        drafters[drafter_arch] = {"registeredAs": [module, cls], "platforms": platforms_list}
    dspark_utils = wheel.read("vllm/v1/worker/gpu/spec_decode/dspark/utils.py") or ""
    speculative = wheel.read("vllm/config/speculative.py") or ""
    eagle3_utils = wheel.read("vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py") or ""
    eagle_config = wheel.read("vllm/transformers_utils/configs/eagle.py") or ""
    release: dict[str, Any] = {
        "wheel": wheel.path.name,
        "sha256": wheel.sha256(),
        "architectures": architectures,
        "drafters": drafters,
        "dspark": {
            "refusesPipelineParallel": DSPARK_PP_REFUSAL in dspark_utils,
            "refusesDecodeContextParallel": DSPARK_DCP_REFUSAL in speculative,
        },
        "checksAuxHiddenStatesOverPP": AUX_PP_CHECK in eagle3_utils,
        "draftInheritsExpertParallel": DRAFT_EP_INHERIT in speculative,
        "draftInheritsPipelineParallel": DRAFT_PP_INHERIT in speculative,
        # What each method renames a drafter to, and what the registry can load.
        "speculativeMethods": extract_methods(eagle_config, speculative),
        # The method names vLLM's SpeculativeConfig accepts at all.
        "speculativeMethodNames": method_names(speculative),
        "speculativeArchitectures": speculative_architectures(registry),
    }
    release["drafterAcceptance"] = acceptance_by_platform(release)
    release["kvTransfer"] = kv_transfer_facts(wheel)
    release["dsparkConfigRefuses"] = dspark_config_refusals(
        wheel.read("vllm/transformers_utils/configs/k3_dspark.py") or ""
    )
    # Where Model Runner V2's parallel drafting takes its slot token from in a config.json.
    release["parallelDraftingTokens"] = parallel_drafting_tokens(
        wheel.read("vllm/v1/worker/gpu/spec_decode/utils.py") or ""
    )
    # Where dspark takes its token count from when the spec gives none (else n_predict).
    release["dsparkTokensFrom"] = dspark_token_fields(
        speculative, wheel.read("vllm/v1/worker/gpu/spec_decode/dspark/config.py") or ""
    )
    # Every option string the release's `vllm serve` parser accepts.
    release["serveFlags"] = serve_flags(wheel.read, wheel.names)
    return release


def download(version: str, directory: pathlib.Path) -> pathlib.Path:
    found = sorted(directory.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            f"vllm=={version}",
            "-d",
            str(directory),
        ],
        check=True,
    )
    return sorted(directory.glob(f"vllm-{version}-*.whl"))[0]


def generate(versions: Iterable[str], directory: pathlib.Path) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    releases = {v: release_capabilities(Wheel(download(v, directory))) for v in versions}
    return {
        "schema": 1,
        "generatedBy": "python -m kimik3_operator.preflight.generate",
        "firstKimiK3Release": RELEASES[0],
        "releases": releases,
    }


def wheels_parser(doc: str | None, output: pathlib.Path) -> argparse.ArgumentParser:
    """The command line of a generator that reads the release wheels into ``output``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--wheels", type=pathlib.Path, default=WHEELS)
    parser.add_argument("--output", type=pathlib.Path, default=output)
    parser.add_argument("versions", nargs="*", default=list(RELEASES))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = wheels_parser(__doc__, TABLE_PATH).parse_args(argv)
    table = generate(args.versions, args.wheels)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.output} ({', '.join(table['releases'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
