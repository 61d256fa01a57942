"""Which flags a release's ``vllm serve`` parser knows, read statically from its wheel.

vLLM builds the parser in ``make_arg_parser``: literal ``add_argument`` calls in the CLI
module and in ``EngineArgs.add_cli_args``, one flag per field of the frontend's argument
dataclasses, and, for a field typed ``bool`` (its own or a config class's, reached through
``get_kwargs(ConfigClass)["field"]``), argparse's ``BooleanOptionalAction``, which adds
``--no-<flag>``. Where the release registers ``EnableDisableAction`` in place of it,
``--enable-x`` and ``--disable-x`` are each other's negation as well.

The vllm tier holds the result to the image's own parser, option string for option string.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Final

ENGINE_ARGS: Final = "vllm/engine/arg_utils.py"
# Where `vllm serve`'s parser lives moved between releases (the probe imports the same).
CLI_ARGS_FILES: Final = (
    "vllm/entrypoints/common/cli_args.py",
    "vllm/entrypoints/launchers/cli_args.py",
    "vllm/entrypoints/openai/cli_args.py",
)
ARGPARSE_FILES: Final = ("vllm/utils/argparse_utils.py", "vllm/utils/__init__.py")
CONFIG_DIR: Final = "vllm/config/"
FLAG = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*$")
Reader = Callable[[str], "str | None"]


def _parse(source: str | None) -> ast.Module | None:
    return ast.parse(source) if source else None


def _fields(cls: ast.ClassDef) -> dict[str, str]:
    """A dataclass's fields and their annotations, as source; ClassVars are not fields."""
    out: dict[str, str] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            if not annotation.startswith(("ClassVar", "typing.ClassVar")):
                out[node.target.id] = annotation
    return out


def _classes(trees: Iterable[ast.Module]) -> dict[str, ast.ClassDef]:
    return {
        node.name: node
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def _all_fields(name: str, classes: dict[str, ast.ClassDef]) -> dict[str, str]:
    """Fields of ``name`` and of its bases known here, the subclass's last (as dataclasses)."""
    cls = classes.get(name)
    if cls is None:
        return {}
    out: dict[str, str] = {}
    for base in cls.bases:
        base_name = ast.unparse(base).split(".")[-1]
        if base_name != name:
            out.update(_all_fields(base_name, classes))
    out.update(_fields(cls))
    return out


def _is_bool(annotation: str) -> bool:
    """What get_kwargs makes a BooleanOptionalAction: any ``bool`` in the type, except the
    optional-valued ``bool | str | None`` (a bare flag or a value)."""
    parts = {p.strip() for p in re.split(r"[|\[\],]", annotation) if p.strip()}
    if "bool" not in parts:
        return False
    return parts not in ({"bool", "str", "None"}, {"Optional", "bool", "str", "None"})


def _calls(tree: ast.AST, attribute: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == attribute
        ):
            yield node


def _kwargs_sources(tree: ast.AST) -> dict[str, str]:
    """``x_kwargs = get_kwargs(ConfigClass)`` → {"x_kwargs": "ConfigClass"}."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("get_kwargs")
            and node.value.args
        ):
            out[node.targets[0].id] = ast.unparse(node.value.args[0]).split(".")[-1]
    return out


def _field_of(value: ast.expr, sources: dict[str, str]) -> tuple[str, str] | None:
    """``x_kwargs["field"]`` or ``get_kwargs(Cls)["field"]`` → (class, field), also inside
    ``{**x_kwargs["field"], "default": None}``."""
    if isinstance(value, ast.Dict):
        pairs = zip(value.keys, value.values, strict=True)
        spread = (_field_of(v, sources) for k, v in pairs if k is None)
        return next((f for f in spread if f is not None), None)
    if not (isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant)):
        return None
    field = value.slice.value
    if not isinstance(field, str):
        return None
    holder = value.value
    if isinstance(holder, ast.Name) and holder.id in sources:
        return sources[holder.id], field
    if isinstance(holder, ast.Call) and ast.unparse(holder.func).endswith("get_kwargs"):
        return ast.unparse(holder.args[0]).split(".")[-1], field
    return None


def _boolean_action(call: ast.Call) -> bool | None:
    """True/False when the call names its action; None when it comes from the kwargs."""
    for keyword in call.keywords:
        if keyword.arg == "action":
            return ast.unparse(keyword.value).endswith("BooleanOptionalAction")
    return None


def _literal_flags(tree: ast.AST, classes: dict[str, ast.ClassDef]) -> tuple[set[str], set[str]]:
    """Option strings of the literal add_argument calls, and those that are negatable."""
    flags: set[str] = set()
    negatable: set[str] = set()
    sources = _kwargs_sources(tree)
    for call in _calls(tree, "add_argument"):
        names = [
            a.value
            for a in call.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and FLAG.match(a.value)
        ]
        if not names:
            continue
        flags.update(names)
        boolean = _boolean_action(call)
        if boolean is None:
            for keyword in call.keywords:
                found = _field_of(keyword.value, sources) if keyword.arg is None else None
                if found is not None:
                    cls, field = found
                    boolean = _is_bool(_all_fields(cls, classes).get(field, ""))
        if boolean:
            negatable.update(n for n in names if n.startswith("--"))
    return flags, negatable


def _frontend_flags(
    tree: ast.Module, classes: dict[str, ast.ClassDef]
) -> tuple[set[str], set[str]]:
    """One flag per field of each frontend class whose add_cli_args `make_arg_parser` calls
    (``--field-name``), the extra spellings ``_customize_cli_kwargs`` gives as ``flags``,
    and the fields that stay boolean (an ``action`` set there replaces the boolean one)."""
    flags: set[str] = set()
    negatable: set[str] = set()
    maker = next(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser"
        ),
        None,
    )
    if maker is None:
        return flags, negatable
    # The engine's own add_cli_args (literal flags) is defined elsewhere; the frontend's
    # classes, registered field by field, here.
    frontend = {c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    for call in _calls(maker, "add_cli_args"):
        owner = ast.unparse(call.func.value).split(".")[-1]  # type: ignore[attr-defined]
        if owner not in frontend:
            continue
        fields = {
            name: annotation
            for name, annotation in _all_fields(owner, classes).items()
            if not name.startswith("_")
        }
        if not fields:
            continue
        overridden: set[str] = set()
        for node in ast.walk(tree):
            # frontend_kwargs["field"]["flags"] = [...] / ["action"] = ...
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                target = node.targets[0]
                key = target.slice
                inner = target.value
                if not (
                    isinstance(key, ast.Constant)
                    and isinstance(inner, ast.Subscript)
                    and isinstance(inner.slice, ast.Constant)
                    and inner.slice.value in fields
                ):
                    continue
                if key.value == "flags":
                    flags.update(
                        c.value
                        for c in ast.walk(node.value)
                        if isinstance(c, ast.Constant)
                        and isinstance(c.value, str)
                        and FLAG.match(c.value)
                    )
                elif key.value == "action":
                    overridden.add(str(inner.slice.value))
        for field, annotation in fields.items():
            flag = "--" + field.replace("_", "-")
            flags.add(flag)
            if _is_bool(annotation) and field not in overridden:
                negatable.add(flag)
    return flags, negatable


def _enable_disable(read: Reader) -> bool:
    return any("EnableDisableAction" in (read(f) or "") for f in ARGPARSE_FILES)


def serve_flags(read: Reader, names: Iterable[str]) -> list[str]:
    """Every option string the release's `vllm serve` parser accepts, sorted.

    ``read`` gives a file of the wheel by its path (None when absent); ``names`` lists the
    wheel's files (for the config classes under vllm/config/)."""
    cli_file = next((f for f in CLI_ARGS_FILES if read(f)), None)
    engine, cli = _parse(read(ENGINE_ARGS)), _parse(read(cli_file) if cli_file else None)
    if engine is None or cli is None:
        return []
    configs = [
        t
        for name in sorted(names)
        if name.startswith(CONFIG_DIR) and name.endswith(".py")
        for t in [_parse(read(name))]
        if t is not None
    ]
    classes = _classes([*configs, engine, cli])
    flags, negatable = {"-h", "--help"}, set()
    for tree in (engine, cli):
        found, negated = _literal_flags(tree, classes)
        flags |= found
        negatable |= negated
    found, negated = _frontend_flags(cli, classes)
    flags |= found
    negatable |= negated
    swap = _enable_disable(read)
    for flag in negatable:
        flags.add("--no-" + flag[2:])
        if swap:
            for prefix, inverse in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
                if flag.startswith(prefix):
                    flags.add(inverse + flag.removeprefix(prefix))
    return sorted(flags)
