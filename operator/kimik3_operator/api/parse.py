"""The one place that parses a resource's spec: types and defaults from the dataclasses,
then the rules the schema states (``api/validation.py``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin

from kimik3_operator.api.constants import MAX_SPEC_BYTES, OVERSIZED_SPEC_KEY
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import SpecError, json_name
from kimik3_operator.api.validation import first_error


def parse_spec(data: Mapping[str, Any] | None) -> KimiK3DeploymentSpec:
    """Parse a resource's ``spec`` into the typed spec, applying every default.

    Raises SpecError naming the first field whose type or value is wrong, and the
    cross-field rules the schema also states (for resources written before the schema).
    """
    if isinstance(data, Mapping) and OVERSIZED_SPEC_KEY in data:
        raise SpecError(
            "spec",
            f"{data[OVERSIZED_SPEC_KEY]} bytes",
            f"is over {MAX_SPEC_BYTES // 1024} KiB, more than the schema lets a spec hold",
            "shrink spec.engine.env (its values together at most 64 KiB; larger ones in a "
            "ConfigMap through valueFrom) and spec.engine.extraArgs",
        )
    spec: KimiK3DeploymentSpec = _parse_dataclass(KimiK3DeploymentSpec, data or {}, "spec")
    validate(spec)
    return spec


def validate(spec: KimiK3DeploymentSpec) -> None:
    error = first_error(spec)
    if error is not None:
        raise error


_FIELDS: dict[type[Any], tuple[tuple[str, str, Any], ...]] = {}


def _fields(cls: type[Any]) -> tuple[tuple[str, str, Any], ...]:
    """(attribute, JSON name, type) of each field, resolved once per class: resolving the
    types cost more than the rest of a parse, and the scrapes and every reconcile parse."""
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = tuple((f.name, json_name(f), hints[f.name]) for f in dataclasses.fields(cls))
        _FIELDS[cls] = found
    return found


def _parse_dataclass(cls: type[Any], data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise SpecError(path, data, "must be an object")
    kwargs: dict[str, Any] = {}
    for name, key, hint in _fields(cls):
        if key in data and data[key] is not None:
            kwargs[name] = _convert(hint, data[key], f"{path}.{key}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        missing = [key for name, key, _ in _fields(cls) if name not in kwargs]
        raise SpecError(
            path, dict(data), f"is missing a required field ({exc})", f"set one of {missing}"
        ) from exc


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        errors: list[SpecError] = []
        for option in options:
            try:
                return _convert(option, value, path)
            except SpecError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise SpecError(path, value, "is not allowed", f"use one of {list(allowed)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise SpecError(path, value, "must be a list")
        item = get_args(hint)[0]
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or hint is Mapping:
        if not isinstance(value, Mapping):
            raise SpecError(path, value, "must be an object")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return _parse_dataclass(hint, value, path)  # type: ignore[arg-type]
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(path, value, "must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, value, "must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(path, value, "must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(path, value, "must be a string")
        return value
    if hint is Any:
        return value
    raise TypeError(f"unsupported type {hint!r} at {path}")
