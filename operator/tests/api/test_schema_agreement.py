"""The CRD schema and the typed spec must agree on every field, type and default."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from kimik3_operator.api.parse import _parse_dataclass
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import json_name


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    version = crd["spec"]["versions"][0]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def _strip_none(hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        return typing.Union[tuple(args)]  # noqa: UP007
    return hint


def _check_type(hint: Any, node: dict[str, Any], path: str, problems: list[str]) -> None:
    hint = _strip_none(hint)
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        if set(get_args(hint)) == {int, str}:
            if not node.get("x-kubernetes-int-or-string"):
                problems.append(f"{path}: int|str but schema is not int-or-string")
            return
        problems.append(f"{path}: unsupported union {hint}")
        return
    if origin is Literal:
        if node.get("type") != "string" or sorted(node.get("enum", [])) != sorted(get_args(hint)):
            problems.append(f"{path}: enum {node.get('enum')} != {get_args(hint)}")
        return
    expected = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if hint in expected:
        if node.get("type") != expected[hint]:
            problems.append(f"{path}: type {node.get('type')} != {expected[hint]}")
        return
    if origin is tuple:
        if node.get("type") != "array":
            problems.append(f"{path}: not an array in the schema")
        return
    if origin in (typing.Mapping, dict) or str(origin).endswith("Mapping'>"):
        if node.get("type") != "object":
            problems.append(f"{path}: not an object in the schema")
        return
    if dataclasses.is_dataclass(hint):
        _check_class(hint, node, path, problems)  # type: ignore[arg-type]
        return
    problems.append(f"{path}: unchecked type {hint}")


def _check_class(cls: type[Any], node: dict[str, Any], path: str, problems: list[str]) -> None:
    if node.get("type") != "object":
        problems.append(f"{path}: schema type {node.get('type')} is not object")
    props = node.get("properties", {})
    hints = typing.get_type_hints(cls)
    keys = set()
    for f in dataclasses.fields(cls):
        key = json_name(f)
        keys.add(key)
        sub = f"{path}.{key}"
        if key not in props:
            problems.append(f"{sub}: in the dataclass, missing from the schema")
            continue
        _check_type(hints[f.name], props[key], sub, problems)
        _check_default(f, hints[f.name], props[key], sub, problems)
    for key in set(props) - keys:
        problems.append(f"{path}.{key}: in the schema, missing from the dataclass")


def _check_default(
    f: dataclasses.Field[Any], hint: Any, node: dict[str, Any], path: str, problems: list[str]
) -> None:
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        if "default" in node:
            problems.append(f"{path}: schema default but the field is required")
        return
    if default is None:
        if "default" in node:
            problems.append(f"{path}: schema default {node['default']!r}, dataclass None")
        return
    if "default" not in node:
        problems.append(f"{path}: dataclass default {default!r}, schema none")
        return
    schema_default = node["default"]
    if dataclasses.is_dataclass(default):
        parsed = _parse_dataclass(type(default), schema_default, path)
        if parsed != default:
            problems.append(f"{path}: schema default parses to {parsed!r}, not {default!r}")
    elif isinstance(default, tuple | dict):
        if list(default) != list(schema_default) and dict(default or {}) != schema_default:
            problems.append(f"{path}: default {schema_default!r} != {default!r}")
    elif schema_default != default:
        problems.append(f"{path}: schema default {schema_default!r} != dataclass {default!r}")


def test_crd_schema_and_dataclasses_agree(crd: dict[str, Any]) -> None:
    problems: list[str] = []
    _check_class(KimiK3DeploymentSpec, _schema(crd), "spec", problems)
    assert problems == []


def test_agreement_check_catches_a_disagreement(crd: dict[str, Any]) -> None:
    schema = _schema(crd)
    schema["properties"]["parallelism"]["properties"]["tensor"]["default"] = 8
    del schema["properties"]["engine"]["properties"]["kvCacheDtype"]
    problems: list[str] = []
    _check_class(KimiK3DeploymentSpec, schema, "spec", problems)
    assert "spec.parallelism.tensor: schema default 8 != dataclass 16" in problems
    assert "spec.engine.kvCacheDtype: in the dataclass, missing from the schema" in problems


def test_every_schema_field_is_documented(crd: dict[str, Any]) -> None:
    undocumented: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if "description" not in sub:
                undocumented.append(f"{path}.{key}")
            walk(sub, f"{path}.{key}")

    walk(_schema(crd), "spec")
    assert undocumented == []


def test_owned_flags_agree_with_the_cel_rule(crd: dict[str, Any]) -> None:
    from kimik3_operator.api.flags import owned_flag_rules

    rules = _schema(crd)["properties"]["engine"]["properties"]["extraArgs"]["items"][
        "x-kubernetes-validations"
    ]
    assert tuple(r["rule"] for r in rules) == owned_flag_rules()
