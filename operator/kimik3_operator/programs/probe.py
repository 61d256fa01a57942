"""The image probe: runs inside the exact vLLM serving image, on a CPU, and asks vLLM itself
what the capability table answers from the wheels. Standalone (the operator ships this file
in a ConfigMap); the generator reuses its static helpers.

Usage: python3 probe.py '<request json>'. The report (compact JSON) goes to stdout and to
/dev/termination-log, where the operator reads it from the pod's status.
`python3 probe.py --differential CASES.json ANSWERS.json` gives vLLM's own verdict on each
case (bench/differential.py).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import json
import os
import pathlib
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

K3_PACKAGE = "vllm.models.kimi_k3"
TEXT_ARCHITECTURE = "KimiLinearForCausalLM"
# The Kimi-K3 classes, answered per platform from the Kimi-K3 package (absent where a release
# or platform lacks them); any other class asked is answered from the registry.
KIMI_CLASSES = (
    TEXT_ARCHITECTURE,
    "KimiK3ForConditionalGeneration",
    "KimiK31ForConditionalGeneration",
)
CLI_ARGS_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)
DSPARK_PP_REFUSAL = "DSpark does not support pipeline parallelism"
DSPARK_DCP_REFUSAL = "MLA DSpark does not currently support decode context"
AUX_PP_CHECK = "def verify_supports_aux_hidden_states_over_pp"
# 0.30.0 gives the drafter the target's expert parallelism whatever the drafter is; a dense
# drafter then fails ModelConfig's "Number of experts ... must be greater than 0".
DRAFT_EP_INHERIT = "enable_expert_parallel=target_parallel_config.enable_expert_parallel"
TARGET_CONFIG_KEYS = (
    "architectures",
    "num_attention_heads",
    "num_experts",
    "vocab_size",
    "num_hidden_layers",
    "num_nextn_predict_layers",
    "max_position_embeddings",
)
DRAFTER_CONFIG_KEYS = (
    "architectures",
    "model_type",
    "vocab_size",
    "draft_vocab_size",
    "n_predict",
    "num_experts",
    "num_local_experts",
    "target_layer_ids",
    "num_target_layers",
    # What vLLM's K3DSparkConfig refuses (the capability table's dsparkConfigRefuses).
    "mla_use_nope",
    "mla_use_output_gate",
    "mla_use_qk_norm",
    "dspark_bonus_anchor",
    "q_lora_rank",
)
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096
# humming-kernels (required by vllm 0.33.0): set, its modules start no background build.
HUMMING_NO_BUILDS = "HUMMING_DISABLE_PARALLEL_BUILD"
# What the probe sets before vLLM's import, where the environment does not say otherwise.
GPU_NODE_ENVIRONMENT = {"CUDA_VISIBLE_DEVICES": "", HUMMING_NO_BUILDS: "1"}


def module_file(module: str, package: bool = False) -> str:
    """vllm.models.kimi_k3.amd.linear -> vllm/models/kimi_k3/amd/linear.py; a package's
    file is its __init__.py."""
    if not module.startswith("vllm."):
        module = f"vllm.model_executor.models.{module}"
    path = module.replace(".", "/")
    return f"{path}/__init__.py" if package else f"{path}.py"


def platform_imports(init_source: str, package: str) -> dict[str, dict[str, str]]:
    """Per platform, the module file each public class is imported from in the package's
    __init__: the ROCm branch is amd; the final else (CUDA, and CPU) is nvidia."""
    result: dict[str, dict[str, str]] = {}

    def imports(body: Iterable[ast.stmt]) -> dict[str, str]:
        out = {}
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module:
                for alias in stmt.names:
                    out[alias.asname or alias.name] = module_file(f"{package}.{stmt.module}")
        return out

    for node in ast.parse(init_source).body:
        if not isinstance(node, ast.If):
            continue
        branch: ast.If | None = node
        while branch is not None:
            if "is_rocm" in ast.unparse(branch.test):
                result["amd"] = imports(branch.body)
            orelse = branch.orelse
            if len(orelse) == 1 and isinstance(orelse[0], ast.If):
                branch = orelse[0]
            else:
                if orelse:
                    result["nvidia"] = imports(orelse)
                branch = None
    return result


def _dotted(file: str) -> str:
    return file[: -len(".py")].replace("/", ".")


def _class_capabilities(cls: type, text_cls: type | None) -> dict[str, Any]:
    from vllm.model_executor.models.interfaces import EagleModelMixin

    caps = {
        "supportsEagle3": bool(getattr(cls, "supports_eagle3", False)),
        "supportsPipelineParallel": bool(getattr(cls, "supports_pp", False)),
        "isHybrid": bool(getattr(cls, "is_hybrid", False)),
        "multimodal": bool(getattr(cls, "supports_multimodal", False)),
    }
    # The inner decoder is the text module's KimiLinearModel (the multimodal class runs the
    # text class inside it).
    source = text_cls or cls
    inner = getattr(sys.modules[source.__module__], "KimiLinearModel", None)
    caps["innerEagleMixin"] = isinstance(inner, type) and issubclass(inner, EagleModelMixin)
    caps["innerAuxHiddenStatesOverPP"] = bool(
        getattr(inner, "supports_aux_hidden_states_over_pp", False)
    )
    return caps


def probe_architectures(root: pathlib.Path, platform: str, wanted: list[str]) -> dict[str, Any]:
    from vllm.model_executor.models.registry import ModelRegistry

    init = (root / module_file(K3_PACKAGE, package=True)).read_text()
    per_platform = platform_imports(init, K3_PACKAGE).get(platform, {})
    answers: dict[str, Any] = {}
    for arch in wanted:
        entry = ModelRegistry.models.get(arch)
        module = getattr(entry, "module_name", None)
        if entry is None or module is None or not str(module).startswith(K3_PACKAGE):
            continue
        file = per_platform.get(entry.class_name)
        if file is None:
            continue
        cls = getattr(importlib.import_module(_dotted(file)), entry.class_name)
        text_file = per_platform.get(TEXT_ARCHITECTURE)
        text_cls = None
        if arch != TEXT_ARCHITECTURE and text_file is not None:
            text_cls = getattr(importlib.import_module(_dotted(text_file)), TEXT_ARCHITECTURE)
        answers[arch] = _class_capabilities(cls, text_cls)
    return answers


def _inner_model(cls: type) -> type | None:
    """The decoder a ``<Name>For...`` class runs, by vLLM's naming (``LlamaForCausalLM`` runs
    ``LlamaModel`` from its module); None where the module has no such class."""
    inner = getattr(sys.modules[cls.__module__], cls.__name__.split("For", 1)[0] + "Model", None)
    return inner if isinstance(inner, type) else None


def probe_declared_classes(architectures: list[str]) -> dict[str, Any]:
    """The capabilities of the classes a checkpoint's config.json names, whatever they are:
    vLLM instantiates the class the checkpoint declares, not the one the spec expects."""
    from vllm.model_executor.models.registry import ModelRegistry

    answers: dict[str, Any] = {}
    for arch in architectures:
        entry = ModelRegistry.models.get(arch)
        module = getattr(entry, "module_name", None)
        if entry is None or module is None:
            answers[arch] = {"registered": False}
            continue
        cls = getattr(importlib.import_module(str(module)), entry.class_name)
        caps = {**_class_capabilities(cls, None), "registered": True}
        inner = _inner_model(cls)
        if inner is None and not str(module).startswith(K3_PACKAGE):
            caps["innerEagleMixin"] = None  # no decoder found by name: vLLM decides at start
        if inner is not None and not str(module).startswith(K3_PACKAGE):
            from vllm.model_executor.models.interfaces import EagleModelMixin

            caps["innerModel"] = inner.__name__
            caps["innerEagleMixin"] = issubclass(inner, EagleModelMixin)
            caps["innerAuxHiddenStatesOverPP"] = bool(
                getattr(inner, "supports_aux_hidden_states_over_pp", False)
            )
        answers[arch] = caps
    return answers


def probe_drafters(root: pathlib.Path) -> dict[str, Any]:
    from vllm.model_executor.models.registry import ModelRegistry

    init = (root / module_file(K3_PACKAGE, package=True)).read_text()
    per_platform = platform_imports(init, K3_PACKAGE)
    drafters = {}
    for arch in ("K3DSparkModel", "KimiK3MTPModel"):
        entry = ModelRegistry.models.get(arch)
        if entry is None:
            continue
        module = str(entry.module_name)
        if module == K3_PACKAGE:
            platforms = sorted(p for p, names in per_platform.items() if entry.class_name in names)
        else:
            platforms = [p for p in ("nvidia", "amd") if f".{p}." in module + "."] or [
                "nvidia",
                "amd",
            ]
        drafters[arch] = {"platforms": platforms}
    return drafters


def _text(root: pathlib.Path, relative: str) -> str:
    path = root / relative
    return path.read_text() if path.exists() else ""


def config_dir(location: dict[str, Any]) -> pathlib.Path | None:
    """The directory holding config.json: a mounted path, or the Hub's file (the token in
    HF_TOKEN) in its local snapshot directory. Only config.json is fetched, never weights."""
    if not location:
        return None
    if location.get("path"):
        return pathlib.Path(location["path"])
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(
        location["repo"],
        "config.json",
        revision=location.get("revision"),
        token=os.environ.get("HF_TOKEN") or None,
    )
    return pathlib.Path(path).parent


def read_config(directory: pathlib.Path | None) -> dict[str, Any] | None:
    if directory is None:
        return None
    return dict(json.loads((directory / "config.json").read_text()))


def device_stub(platform: str) -> str:
    """vLLM's parser defaults and configuration ask the platform for a device. A GPU image
    on the probe's CPU node finds none (vLLM's UnspecifiedPlatform, with no device type):
    that platform answers as a CUDA device, the one thing stubbed. What stays unasked is
    the GPU platform's own configuration hook (CUDA's or ROCm's attention backend and kernel
    choices, which only the engine's start on the GPU decides). An image built for the CPU
    keeps its own platform: its pods run there. The stand-in also answers, as CUDA's and
    ROCm's platforms do, that it keeps the hybrid KV-cache manager. Returns what stands in,
    for the report."""
    if _STUB:
        return _STUB[0]
    from vllm.platforms import current_platform

    kind = type(current_platform)
    if getattr(kind, "device_type", ""):
        _STUB.append(f"{kind.__name__} ({kind.device_type}), the image's own")
    else:
        kind.device_type = "cuda"
        # CUDA's and ROCm's platforms both keep the hybrid KV-cache manager, which a
        # disaggregated pair's pods ask for explicitly; the unspecified platform does not.
        kind.support_hybrid_kv_cache = classmethod(lambda cls: True)
        _STUB.append(f"{kind.__name__} answering as a CUDA device for {platform}")
    return _STUB[0]


_STUB: list[str] = []  # what device_stub answered: a process stubs once


def _on_stand_in() -> bool:
    """Whether device_stub made the platform answer as a device it is not (a GPU image on
    the probe's CPU node)."""
    return bool(_STUB) and "answering as" in _STUB[0]


def _short(error: BaseException) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    # vLLM appends every architecture it knows; what comes before is the answer.
    return text.split(" Supported architectures:", maxsplit=1)[0][:600]


def check_speculative(
    request: dict[str, Any], target_dir: pathlib.Path | None, drafter_dir: pathlib.Path | None
) -> dict[str, Any]:
    """Builds vLLM's SpeculativeConfig for the rendered spec from the configs alone (no
    weights): the same renaming and validation the serving pods would run at start."""
    config = request.get("speculativeConfig")
    if not config:
        return {}
    try:
        device_stub(str(request.get("platform", "nvidia")))
        from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

        target = ModelConfig(model=str(target_dir), skip_tokenizer_init=True)
        parallel = ParallelConfig(
            tensor_parallel_size=int(request.get("tensorParallel", 1)),
            pipeline_parallel_size=int(request.get("pipelineParallel", 1)),
        )
    except Exception as exc:  # not vLLM's verdict on the drafter: say why it was not asked
        return {"skipped": _short(exc)}
    arguments = {k: v for k, v in config.items() if k not in ("model", "revision")}
    if drafter_dir is not None:
        arguments["model"] = str(drafter_dir)
    try:
        built = SpeculativeConfig(
            **arguments, target_model_config=target, target_parallel_config=parallel
        )
    except Exception as exc:
        return {"ok": False, "error": _short(exc)}
    draft = getattr(built, "draft_model_config", None)
    return {"ok": True, "draftArchitectures": list(getattr(draft, "architectures", []) or [])}


def _unknown_flags(message: str) -> list[str]:
    marker = "unrecognized arguments:"
    if marker not in message:
        return []
    tail = message.split(marker, 1)[1].splitlines()[0]
    return [word for word in tail.split() if word.startswith("-")]


def check_serve(serve: dict[str, list[str]], platform: str = "nvidia") -> dict[str, Any]:
    """Parses each rendered `vllm serve` command line with the image's own parser."""
    if not serve:
        return {}
    try:
        device_stub(platform)
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        # Where `vllm serve`'s parser lives moved between releases.
        cli_args = None
        for module in CLI_ARGS_MODULES:
            try:
                cli_args = importlib.import_module(module)
                break
            except ModuleNotFoundError:
                continue
        if cli_args is None:
            raise ModuleNotFoundError(f"none of {', '.join(CLI_ARGS_MODULES)}")
        make_arg_parser = cli_args.make_arg_parser
        validate_parsed_serve_args = cli_args.validate_parsed_serve_args
    except Exception as exc:
        return {role: {"skipped": _short(exc)} for role in serve}
    answers: dict[str, Any] = {}
    for role, argv in serve.items():
        stderr, stdout = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
                args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
                validate_parsed_serve_args(args)
        except SystemExit as exc:
            # argparse writes to stderr; anything else that exits says so where it can.
            message = (
                stderr.getvalue().strip()
                or stdout.getvalue().strip()
                or f"the parser exited with {exc.code!r} and no message"
            )
            answers[role] = {
                "ok": False,
                "error": " ".join(message.splitlines()[-2:])[-600:],
                "unknownFlags": _unknown_flags(message),
            }
            continue
        except Exception as exc:
            answers[role] = {"ok": False, "error": _short(exc), "unknownFlags": []}
            continue
        answers[role] = {"ok": True}
    return answers


def _serve_parser() -> Any:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for module in CLI_ARGS_MODULES:
        try:
            cli_args = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        return cli_args.make_arg_parser(FlexibleArgumentParser())
    raise ModuleNotFoundError(f"none of {', '.join(CLI_ARGS_MODULES)}")


def engine_argv(
    argv: list[str], target_dir: pathlib.Path | None, drafter_dir: pathlib.Path | None
) -> list[str]:
    """The leader's command line with the checkpoints where the probe has their configs:
    the model (the first argument) and the speculative config's drafter."""
    out = list(argv)
    if target_dir is not None and out and not out[0].startswith("-"):
        out[0] = str(target_dir)
    for index, arg in enumerate(out[:-1]):
        if arg == "--speculative-config" and drafter_dir is not None:
            config = json.loads(out[index + 1])
            if config.get("model"):
                config["model"] = str(drafter_dir)
                config.pop("revision", None)
            out[index + 1] = json.dumps(config)
    # The configs come without a tokenizer; the engine's own start loads it.
    return [*out, "--skip-tokenizer-init"]


def check_engine(
    argv: list[str] | None,
    target_dir: pathlib.Path | None,
    drafter_dir: pathlib.Path | None,
    platform: str,
    built: list[Any] | None = None,
) -> dict[str, Any]:
    """vLLM's whole configuration (EngineArgs from the image's parser, then VllmConfig:
    model, parallel, cache, speculative, scheduler and the platform's own checks), built
    from the leader's command line the way `vllm serve` builds it at start, from the configs
    alone and with the device stubbed (device_stub). The configuration built is appended to
    ``built`` for the steps after it."""
    if not argv:
        return {}
    if target_dir is None:
        return {"skipped": "the target's config.json could not be read"}
    stub = device_stub(platform)
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs

        parser = _serve_parser()
    except Exception as exc:
        return {"skipped": _short(exc), "device": stub}
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(engine_argv(argv, target_dir, drafter_dir))
        if getattr(args, "model_tag", None):
            args.model = args.model_tag
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    except SystemExit:
        return {"ok": False, "error": stderr.getvalue().strip()[-600:], "device": stub}
    except Exception as exc:
        return {"ok": False, "error": _short(exc), "device": stub}
    if built is not None:
        built.append(config)
    return {"ok": True, "device": stub}


# What a model's constructor raises when it refuses its configuration (vLLM's own idioms:
# `assert heads % tp_size == 0`, `raise ValueError(...)`, `raise NotImplementedError(...)`).
REFUSAL_TYPES = (ValueError, AssertionError, NotImplementedError)
# An H100's streaming multiprocessors: what the stand-in device answers for compute units.
STAND_IN_COMPUTE_UNITS = 132
# Where the probe's stand-ins live: an exception raised there is the stand-in's, not a
# refusal of the configuration.
STAND_IN_MODULES = ("vllm/platforms/", "vllm/v1/attention/", "vllm/distributed/parallel_state.py")


def vllm_path(filename: str) -> str | None:
    """``vllm/...`` for a file in vLLM's package, wherever it is installed; else None."""
    path = filename.replace(os.sep, "/")
    return "vllm/" + path.rsplit("/vllm/", 1)[1] if "/vllm/" in path else None


def _innermost(error: BaseException) -> str:
    """``file:line`` where ``error`` was raised, under vLLM's package when it was there."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "unknown"
    return f"{vllm_path(frames[-1].filename) or frames[-1].filename}:{frames[-1].lineno}"


def _missing_config_field(error: BaseException) -> bool:
    """A model class reading a field its checkpoint's config.json does not have: the engine
    stops there at start the same way."""
    owner = getattr(error, "obj", None) if isinstance(error, AttributeError) else None
    return owner is not None and type(owner).__name__.endswith("Config")


def refusal_site(error: BaseException) -> str | None:
    """``file:line`` of the innermost vLLM frame that raised ``error`` when it is a refusal
    by vLLM's model code; None when it came from elsewhere (a kernel missing on this CPU
    node, a stand-in, PyTorch itself)."""
    if not isinstance(error, REFUSAL_TYPES) and not _missing_config_field(error):
        return None
    inner = [
        (path, frame.lineno)
        for frame in traceback.extract_tb(error.__traceback__)
        if (path := vllm_path(frame.filename))
    ]
    if not inner or inner[-1][0].startswith(STAND_IN_MODULES):
        return None
    return f"{inner[-1][0]}:{inner[-1][1]}"


def _refusal_text(error: BaseException) -> str:
    """vLLM's message; for a bare ``assert``, the statement that failed."""
    text = _short(error)
    if isinstance(error, AssertionError) and not str(error).strip():
        import linecache

        frame = traceback.extract_tb(error.__traceback__)[-1]
        line = linecache.getline(frame.filename, frame.lineno or 0).strip()
        text = f"AssertionError: {line}" if line else text
    return text


def _stand_in_groups(config: Any) -> list[str]:
    """One process stands for rank 0 of every group: vLLM's distributed state is set up
    for a world of one (gloo, on the loopback), then each group answers the configured size.
    Constructors only ask the sizes and their rank to shard the layers; nothing is sent."""
    import socket

    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed import parallel_state as state

    if not state.model_parallel_is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        # With no configuration current: with one, vLLM joins the group's other nodes
        # (--nnodes, --master-addr, data-parallel peers), which the probe has none of, and
        # would wait for them.
        holder: Any = importlib.import_module("vllm.config.vllm")
        current = getattr(holder, "_current_vllm_config", None)
        if current is not None:
            holder._current_vllm_config = None
        try:
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
                backend="gloo",
            )
        finally:
            if current is not None:
                holder._current_vllm_config = current
        with set_current_vllm_config(config):
            initialize_model_parallel(1, 1)
    parallel = config.parallel_config
    sizes = {
        "_TP": parallel.tensor_parallel_size,
        "_PP": parallel.pipeline_parallel_size,
        "_DCP": getattr(parallel, "decode_context_parallel_size", 1),
    }
    said = []
    for name, size in sizes.items():
        group = getattr(state, name, None)
        if group is not None:
            group.world_size = size
            if size > 1:
                said.append(f"{name[1:].lower()}={size}")
    return [f"rank 0 of each parallel group ({', '.join(said) or 'all of size 1'}), no peers"]


def _stand_in_attention() -> str | None:
    """On the stand-in device (device_stub) the GPU platform's attention selection cannot
    run (it asks the device); each attention layer gets vLLM's Triton backend, MLA or not.
    Which kernel serves a layer changes no weight's shape: the GPU's own choice, and its
    refusals, come when the engine starts. An image built for the CPU keeps its own."""
    from vllm.platforms import current_platform

    kind = type(current_platform)
    if not _on_stand_in():
        return None

    def backend(cls: Any, *args: Any, **kwargs: Any) -> str:
        selector = kwargs.get("attn_selector_config")
        mla = getattr(selector, "use_mla", kwargs.get("use_mla", False))
        if mla:
            return "vllm.v1.attention.backends.mla.triton_mla.TritonMLABackend"
        return "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"

    kind.get_attn_backend_cls = classmethod(backend)
    return "attention backends: Triton's in every layer (the GPU picks its own at start)"


def _replace_everywhere(original: Any, replacement: Any) -> None:
    """``original`` replaced in every module that holds it (its own, and those that imported
    it by name); a module imported later takes the replacement from its own."""
    for module in list(sys.modules.values()):
        held = getattr(module, "__dict__", None)
        if not isinstance(held, dict):
            continue
        for name, value in list(held.items()):
            if value is original:
                held[name] = replacement


def _stand_in_kernels() -> list[str]:
    """The rest of the kernel choices a GPU platform makes from its device while the models
    are constructed, each given an answer that changes no shape: the unquantized MoE experts
    get Triton's kernel (the GPU's oracle picks at start), the MLA prefill PyTorch's SDPA
    (the GPU picks its own), and the device's compute units (sizing kernel grids) an H100's
    132. An image built for the CPU keeps its own answers."""
    if not _on_stand_in():
        return []
    from vllm.platforms import current_platform

    kind = type(current_platform)
    kind.num_compute_units = classmethod(lambda cls, device_id=0: STAND_IN_COMPUTE_UNITS)
    said = [f"compute units: {STAND_IN_COMPUTE_UNITS} (they size kernel grids, no shape)"]
    # (module, its selecting function, the answer given that module, what the report says)
    choices: tuple[tuple[str, str, Callable[[Any], Any], str], ...] = (
        (
            "vllm.model_executor.layers.fused_moe.oracle.unquantized",
            "select_unquantized_moe_backend",
            lambda oracle: (
                oracle.UnquantizedMoeBackend.TRITON,
                _attribute("vllm.model_executor.layers.fused_moe.experts.triton_moe:TritonExperts"),
            ),
            "MoE experts: Triton's kernel (the GPU's oracle picks at start)",
        ),
        (
            "vllm.v1.attention.backends.mla.prefill",
            "get_mla_prefill_backend",
            lambda _: _attribute(
                "vllm.v1.attention.backends.mla.prefill.cpu_sdpa:CPUSDPAMLAPrefillBackend"
            ),
            "MLA prefill: PyTorch's SDPA (the GPU picks its own at start)",
        ),
    )
    for module_name, function, answer_for, note in choices:
        try:
            module = importlib.import_module(module_name)
            _replace_everywhere(getattr(module, function), _answering(answer_for(module)))
        except (ImportError, AttributeError):
            continue
        said.append(note)
    return said


def _attribute(path: str) -> Any:
    """``module:name``, imported."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _answering(answer: Any) -> Callable[..., Any]:
    """A selecting function that always gives ``answer``."""

    def choice(*args: Any, **kwargs: Any) -> Any:
        return answer

    return choice


class _InertStream:
    """Stands for a CUDA stream or event on a node without a driver: a constructor keeps the
    handle for the forward pass, which the probe never runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _inert_cuda_streams(stubbed: list[str]) -> Iterator[None]:
    import torch

    if torch.cuda.is_available() or not _on_stand_in():
        yield
        return
    saved = torch.cuda.Stream, torch.cuda.Event
    torch.cuda.Stream, torch.cuda.Event = _InertStream, _InertStream
    note = "CUDA streams and events: inert (a constructor only keeps them)"
    if note not in stubbed:
        stubbed.append(note)
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.Event = saved


def check_construction(config: Any) -> dict[str, Any]:
    """The target and the drafter constructed as the model runner constructs them before it
    reads the first weight, from the configuration check_engine built, on PyTorch's meta
    device (every shape, no memory): what their classes refuse (heads or KV heads that do not
    shard over the tensor size, a drafter's layers, sizes and flags) fails here with vLLM's
    message and the line that raised it. What stands in is listed under ``stubbed``."""
    try:
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import initialize_model

        stubbed = _stand_in_groups(config)
        attention = _stand_in_attention()
        if attention:
            stubbed.append(attention)
        stubbed.extend(_stand_in_kernels())
    except Exception as exc:  # not vLLM's verdict on the models: say why it was not asked
        return {"skipped": _short(exc)}
    speculative = getattr(config, "speculative_config", None)
    models = [("target", config.model_config)]
    draft = getattr(speculative, "draft_model_config", None)
    if draft is not None:
        models.append(("drafter", draft))
    built: list[str] = []
    not_built: dict[str, str] = {}
    compilation: Any = getattr(config, "compilation_config", None)
    for role, model_config in models:
        # Each model registers its layers by name; the runner names the drafter's apart
        # from the target's, so each is constructed with a registry of its own.
        if isinstance(getattr(compilation, "static_forward_context", None), dict):
            compilation.static_forward_context = {}
        try:
            with (
                set_current_vllm_config(config),
                torch.device("meta"),
                _inert_cuda_streams(stubbed),
            ):
                model = initialize_model(vllm_config=config, model_config=model_config)
        except Exception as exc:
            site = refusal_site(exc)
            if site is None:
                # A choice only the GPU can make (a kernel, a backend) stopped it: no verdict.
                not_built[role] = f"{_short(exc)[:300]} (at {_innermost(exc)})"
                continue
            return {
                "ok": False,
                "model": role,
                "error": _refusal_text(exc),
                "site": site,
                "built": built,
                "stubbed": stubbed,
            }
        built.append(f"{role}: {type(model).__name__}")
    proposer = _proposer(config, stubbed)
    if proposer.get("refused"):
        refused = proposer.pop("refused")
        return {
            "ok": False,
            "model": "proposer",
            **refused,
            "built": built,
            "proposer": proposer,
            "stubbed": stubbed,
        }
    if proposer.get("notBuilt"):
        not_built["proposer"] = proposer["notBuilt"]
    answer = {"ok": not not_built, "built": built, "notBuilt": not_built, "stubbed": stubbed}
    return {**answer, "proposer": proposer} if proposer else answer


def _picks_v2_runner(config: Any) -> bool:
    """Which model runner the release runs for this configuration: its own answer where it
    has one (VllmConfig.use_v2_model_runner); else V2 where the V1 runner is gone."""
    if hasattr(type(config), "use_v2_model_runner"):
        return bool(config.use_v2_model_runner)
    return importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None


def _proposer(config: Any, stubbed: list[str]) -> dict[str, Any]:
    """The proposer the release's model runner picks for this configuration, built as that
    runner builds it before the weights: Model Runner V2 by vLLM's own ``init_speculator``
    (on the meta device). The V1 runner picks inside its own constructor, on the worker's
    device; its pick is judged at start. {} without speculative decoding."""
    if getattr(config, "speculative_config", None) is None:
        return {}
    try:
        import torch
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(config):
            v2 = _picks_v2_runner(config)
        if not v2:
            return {
                "runner": "v1",
                "notBuilt": "the V1 model runner picks its proposer in its own constructor, "
                "on the worker's own device (a GPU, or a CPU image's CPU worker)",
            }
        from vllm.v1.worker.gpu.spec_decode import init_speculator

        meta = torch.device("meta")
        with set_current_vllm_config(config), meta, _inert_cuda_streams(stubbed):
            speculator = init_speculator(config, meta, None)
    except Exception as exc:
        site = refusal_site(exc)
        if site is None:
            return {"runner": "v2", "notBuilt": f"{_short(exc)[:300]} (at {_innermost(exc)})"}
        return {"runner": "v2", "refused": {"error": _refusal_text(exc), "site": site}}
    return {"runner": "v2", "class": type(speculator).__name__}


def _engine_config(
    argv: list[str], target_dir: pathlib.Path, drafter_dir: pathlib.Path | None
) -> Any:
    """VllmConfig from a command line, as `vllm serve` builds it at start (check_engine)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = _serve_parser().parse_args(engine_argv(argv, target_dir, drafter_dir))
    except SystemExit as exc:
        raise ValueError(stderr.getvalue().strip()[-600:]) from exc
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    return AsyncEngineArgs.from_cli_args(args).create_engine_config()


def _nixl_factors(config: Any) -> tuple[str, dict[str, Any]]:
    """vLLM's own NIXL compatibility hash of one side, and the factors it hashed (taken as
    vLLM hands them to its hash function). The attention backend is the one thing the GPU
    platform picks at start: both sides run the same image on the same platform, so it is
    named from the configuration (an explicit --attention-backend, else "auto") alike."""
    import vllm.config.utils as config_utils
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata

    seen: dict[str, Any] = {}
    original = config_utils.hash_factors

    def recording(factors: dict[str, Any]) -> str:
        seen.update(factors)
        return str(original(factors))

    attention = getattr(getattr(config, "attention_config", None), "backend", None)
    config_utils.hash_factors = recording
    try:
        digest = metadata.compute_nixl_compatibility_hash(config, str(attention or "auto"))
    finally:
        config_utils.hash_factors = original
    return str(digest), seen


def check_pair(
    serve: dict[str, list[str]],
    target_dir: pathlib.Path | None,
    drafter_dir: pathlib.Path | None,
    platform: str,
) -> dict[str, Any]:
    """For a prefill/decode pair: each side's configuration built from its own leader's
    command line, and vLLM's NIXL compatibility hash of each, which the decode side compares
    at its first handshake with a prefill group. A factor that differs is named."""
    sides = {"prefill": serve.get("prefill-leader"), "decode": serve.get("leader")}
    if not sides["prefill"]:
        return {}
    if target_dir is None:
        return {"skipped": "the target's config.json could not be read"}
    device_stub(platform)
    built: dict[str, Any] = {}
    for side, argv in sides.items():
        try:
            built[side] = _engine_config(list(argv or []), target_dir, drafter_dir)
        except Exception as exc:
            return {"ok": False, "side": side, "error": _short(exc)}
    try:
        hashes = {side: _nixl_factors(config) for side, config in built.items()}
    except Exception as exc:  # not vLLM's verdict on the pair: say why it was not asked
        return {"skipped": _short(exc)}
    (prefill, prefill_factors), (decode, decode_factors) = hashes["prefill"], hashes["decode"]
    differing = sorted(
        key
        for key in set(prefill_factors) | set(decode_factors)
        if prefill_factors.get(key) != decode_factors.get(key)
    )
    return {
        "ok": prefill == decode,
        "prefillHash": prefill[:16],
        "decodeHash": decode[:16],
        "differing": {
            key: [repr(prefill_factors.get(key))[:120], repr(decode_factors.get(key))[:120]]
            for key in differing
        },
        "connectorVersion": prefill_factors.get("nixl_connector_version"),
    }


def _subset(config: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any] | None:
    if config is None:
        return None
    text = config.get("text_config") or config
    return {k: text.get(k, config.get(k)) for k in keys if k in text or k in config}


def _gpu_node_environment() -> None:
    """Before vLLM is imported: vLLM turns Triton off when it finds no active GPU driver,
    as on the probe's CPU node, and then refuses what needs it (Model Runner V2). An empty
    CUDA_VISIBLE_DEVICES is vLLM's own case of a GPU node whose devices are not yet
    visible, where it keeps Triton; the probe sees no device either way. The probe runs no
    kernel: the humming kernels vLLM 0.33 requires would start two background builds of their
    CUDA launcher when imported (each a Python importing torch, beside the probe in its one
    CPU), so they are turned off."""
    for name, value in GPU_NODE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def probe(request: dict[str, Any]) -> dict[str, Any]:
    _gpu_node_environment()
    import vllm

    root = pathlib.Path(vllm.__file__).resolve().parent.parent
    platform = request.get("platform", "nvidia")
    report: dict[str, Any] = {
        "vllmVersion": getattr(vllm, "__version__", "unknown"),
        "platform": platform,
        "errors": [],
    }
    report["architectures"] = probe_architectures(root, platform, request["architectures"])
    report["drafters"] = probe_drafters(root)
    report["dspark"] = {
        "refusesPipelineParallel": DSPARK_PP_REFUSAL
        in _text(root, "vllm/v1/worker/gpu/spec_decode/dspark/utils.py"),
        "refusesDecodeContextParallel": DSPARK_DCP_REFUSAL
        in _text(root, "vllm/config/speculative.py"),
    }
    report["draftInheritsExpertParallel"] = DRAFT_EP_INHERIT in _text(
        root, "vllm/config/speculative.py"
    )
    report["checksAuxHiddenStatesOverPP"] = AUX_PP_CHECK in _text(
        root, "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
    )
    # Each config.json is fetched once, for the report and for vLLM's own checks.
    dirs: dict[str, pathlib.Path | None] = {}
    for key, keys in (("target", TARGET_CONFIG_KEYS), ("drafter", DRAFTER_CONFIG_KEYS)):
        try:
            dirs[key] = config_dir(request.get(key) or {})
            report[f"{key}Config"] = _subset(read_config(dirs[key]), keys)
        except Exception as exc:  # a missing config is reported, not fatal
            dirs[key] = None
            report["errors"].append(f"{key} config.json: {type(exc).__name__}: {exc}"[:300])
    # Classes outside the Kimi-K3 package (the spec's, or what the checkpoint declares) are
    # answered from the registry and the class itself, whatever they are.
    declared = (report.get("targetConfig") or {}).get("architectures") or []
    asked = [a for a in request["architectures"] if a not in KIMI_CLASSES]
    unknown = [
        str(a) for a in dict.fromkeys([*declared, *asked]) if str(a) not in report["architectures"]
    ]
    report["architectures"].update(probe_declared_classes(unknown))
    device_stub(platform)
    report["speculative"] = check_speculative(request, dirs["target"], dirs["drafter"])
    report["serve"] = check_serve(request.get("serve") or {}, platform)
    leader = (request.get("serve") or {}).get("leader")
    configs: list[Any] = []
    report["engine"] = check_engine(leader, dirs["target"], dirs["drafter"], platform, configs)
    if configs:
        report["construct"] = check_construction(configs[0])
    pair = check_pair(request.get("serve") or {}, dirs["target"], dirs["drafter"], platform)
    if pair:
        report["pair"] = pair
    return report


def differential(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's verdict on each case (a leader command line and the target's and drafter's
    config.json): the full configuration build, as check_engine makes it in the probe, and
    where the case asks (``"construct": true``) the models constructed from it."""
    import tempfile

    _gpu_node_environment()
    answers = []
    with tempfile.TemporaryDirectory() as work:
        for number, case in enumerate(cases):
            dirs: dict[str, pathlib.Path | None] = {}
            for key in ("target", "drafter"):
                config = case.get(f"{key}Config")
                if config is None:
                    dirs[key] = None
                    continue
                directory = pathlib.Path(work) / f"{number}-{key}"
                directory.mkdir()
                (directory / "config.json").write_text(json.dumps(config))
                dirs[key] = directory
            built: list[Any] = []
            answer = check_engine(
                case["argv"], dirs["target"], dirs["drafter"], case["platform"], built
            )
            if built and case.get("construct"):
                answer["construct"] = check_construction(built[0])
            answers.append({"id": case["id"], **answer})
    return answers


def main(argv: list[str]) -> int:
    if len(argv) > 3 and argv[1] == "--differential":
        # Cases in, answers out, as files: vLLM logs to stdout.
        cases = json.loads(pathlib.Path(argv[2]).read_text())
        pathlib.Path(argv[3]).write_text(json.dumps(differential(cases)))
        return 0
    request = json.loads(argv[1]) if len(argv) > 1 else json.loads(sys.stdin.read())
    try:
        report = probe(request)
        code = 0
    except Exception as exc:
        report = {"fatal": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        code = 1
    text = json.dumps(report, separators=(",", ":"), sort_keys=True)
    print(text)
    # The kubelet creates the file world-writable, so a non-root probe can write it;
    # outside a pod it does not exist and nothing is written.
    if os.path.exists(TERMINATION_LOG):
        try:
            with open(TERMINATION_LOG, "w") as log:
                log.write(text[:TERMINATION_LIMIT])
        except OSError:
            pass
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
