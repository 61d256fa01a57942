"""The CRD's CEL rules (its ``x-kubernetes-validations``), evaluated offline by cel-python as
the API server evaluates them when a KimiK3Deployment is created: on the object after the
schema's defaults, each rule at its node with ``self`` bound to that node's value, a failed
rule reported at its node (and ``fieldPath``) with the rule's message.

Rules that read ``oldSelf`` compare with the stored object; the API server runs them only on
an update, and so are they left out here (the CLI checks a resource to be created). The two
functions of Kubernetes' CEL libraries that the rules use beside standard CEL, a list's
``sum()`` and a string's regex ``find()``, are given to cel-python here. The operator process
never imports this module: it is the CLI's.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

Node = Mapping[str, Any]


def with_defaults(value: Any, schema: Node) -> Any:
    """``value`` with the schema's defaults filled in, as the API server fills them before
    it validates: a missing property with a default gets it (then its own defaults)."""
    if isinstance(value, dict):
        filled = dict(value)
        for name, sub in (schema.get("properties") or {}).items():
            if name not in filled and "default" in sub:
                filled[name] = copy.deepcopy(sub["default"])
            if name in filled:
                filled[name] = with_defaults(filled[name], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for name in set(filled) - set(schema.get("properties") or {}):
                filled[name] = with_defaults(filled[name], extra)
        return filled
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def _children(value: Any, schema: Node, path: str) -> Iterator[tuple[Any, Node, str]]:
    if isinstance(value, Mapping):
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            if name in value:
                yield value[name], sub, f"{path}.{name}"
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for name in value:
                if name not in properties:
                    yield value[name], extra, f"{path}[{name}]"
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            yield item, schema["items"], f"{path}[{index}]"


def _walk(value: Any, schema: Node, path: str) -> Iterator[tuple[Any, Mapping[str, Any], str]]:
    for rule in schema.get("x-kubernetes-validations") or []:
        yield value, rule, path
    for child, sub, where in _children(value, schema, path):
        yield from _walk(child, sub, where)


@cache
def _program(rule: str) -> Any:
    import celpy
    from celpy import celtypes

    def sum_of(items: Any) -> Any:
        return sum(items, celtypes.IntType(0))

    def find(text: Any, pattern: Any) -> Any:
        found = re.search(str(pattern), str(text))
        return celtypes.StringType(found.group(0) if found else "")

    # cel-python raises the process's recursion limit when it makes an environment; the
    # rules here are shallow, and the rest of the process keeps its own limit.
    limit = sys.getrecursionlimit()
    try:
        env = celpy.Environment()
        return env.program(env.compile(rule), functions={"sum": sum_of, "find": find})
    finally:
        sys.setrecursionlimit(limit)


def cel_errors(resource: Mapping[str, Any], schema: Node) -> list[str]:
    """Every CEL rule of ``schema`` (the CRD's openAPIV3Schema) that ``resource`` breaks,
    each as the API server says it: ``<field>: <reason>: <message>``."""
    from celpy.adapter import json_to_cel

    found: list[str] = []
    obj = with_defaults(dict(resource), schema)
    for value, rule, path in _walk(obj, schema, ""):
        text = str(rule["rule"])
        if "oldSelf" in text:
            continue
        try:
            result = _program(text).evaluate({"self": json_to_cel(value)})
        except Exception as exc:  # cel-python's evaluation errors have no common base
            result = exc
        if isinstance(result, Exception):
            found.append(f"{path.lstrip('.') or '<root>'}: rule {text!r} could not run: {result}")
        elif not bool(result):
            where = (path + str(rule.get("fieldPath") or "")).lstrip(".") or "<root>"
            reason = {"FieldValueForbidden": "Forbidden", "FieldValueRequired": "Required"}.get(
                str(rule.get("reason")), "Invalid value"
            )
            found.append(f"{where}: {reason}: {rule.get('message') or text}")
    return found
