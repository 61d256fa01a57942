"""The CRD's own OpenAPI schema, applied offline as the API server applies it at
``kubectl apply``: the apiVersion and kind, unknown fields (kubectl's strict field
validation), types, enums, bounds, lengths, patterns and list sizes, with the field named and,
for a misspelt field or value, the nearest one the schema has; then the schema's CEL rules,
by a CEL implementation (``api/cel_rules.py``), so the CLI refuses what ``kubectl apply``
refuses. ``parse_spec`` states each rule again for the operator, which reads resources stored
before a rule existed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

import yaml

from kimik3_operator.api import constants as c

Node = Mapping[str, Any]
# The metadata.name rules the CRD states in CEL.
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 49


@cache
def crd_schema() -> Node:
    """The openAPIV3Schema of the CRD this package ships (data/crd.yaml, a copy of
    manifests/crd/)."""
    text = resources.files("kimik3_operator").joinpath("data/crd.yaml").read_text()
    crd = yaml.safe_load(text)
    schema: Node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def nearest(word: str, choices: Iterator[str] | list[str] | tuple[str, ...]) -> str:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return found[0] if found else ""


def schema_errors(resource: Mapping[str, Any]) -> list[str]:
    """Every refusal of ``resource`` (a whole KimiK3Deployment), each naming its field."""
    found: list[str] = []
    if resource.get("apiVersion") != c.API_VERSION:
        found.append(
            f"apiVersion: {resource.get('apiVersion')!r} is not served for {c.KIND}; "
            f"use {c.API_VERSION}"
        )
    meta = resource.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        found.append("metadata.name: Required value")
    elif len(name) > MAX_NAME or not NAME.match(name):
        found.append(
            f"metadata.name: Invalid value: {name!r}: at most {MAX_NAME} characters, a DNS-1035 "
            "label (lower-case letters, digits and '-', starting with a letter)"
        )
    spec_schema = crd_schema()["properties"]["spec"]
    found += list(_check(resource.get("spec") or {}, spec_schema, "spec"))
    if not found:
        # The API server runs the CEL rules on a well-typed, defaulted object.
        from kimik3_operator.api.cel_rules import cel_errors

        found += cel_errors(resource, crd_schema())
    return found


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return "null"


def _check(value: Any, node: Node, path: str) -> Iterator[str]:
    if value is None and node.get("nullable"):
        return
    if node.get("x-kubernetes-int-or-string"):
        if _type_of(value) not in ("integer", "string"):
            yield f"{path}: Invalid value: {_type_of(value)}: must be an integer or a string"
        return
    expected = node.get("type")
    actual = _type_of(value)
    if expected and actual != expected and not (expected == "number" and actual == "integer"):
        yield f"{path}: Invalid value: {actual!r}: {path} must be of type {expected}"
        return
    if expected == "object" or isinstance(value, Mapping):
        yield from _check_object(value, node, path)
    elif expected == "array":
        yield from _check_array(value, node, path)
    elif expected == "string":
        yield from _check_string(value, node, path)
    elif expected in ("integer", "number"):
        yield from _check_number(value, node, path)


def _check_object(value: Mapping[str, Any], node: Node, path: str) -> Iterator[str]:
    properties: Node = node.get("properties") or {}
    extra = node.get("additionalProperties")
    if "maxProperties" in node and len(value) > node["maxProperties"]:
        yield f"{path}: Too many: {len(value)}: must have at most {node['maxProperties']} items"
    for key in node.get("required") or []:
        if key not in value:
            yield f"{path}.{key}: Required value"
    for key, item in value.items():
        if key in properties:
            yield from _check(item, properties[key], f"{path}.{key}")
        elif isinstance(extra, Mapping):
            yield from _check(item, extra, f"{path}.{key}")
        elif not node.get("x-kubernetes-preserve-unknown-fields") and extra is not True:
            near = nearest(key, tuple(properties))
            hint = f"; did you mean {path}.{near}?" if near else ""
            yield f"{path}.{key}: unknown field (not in the schema){hint}"


def _check_array(value: list[Any], node: Node, path: str) -> Iterator[str]:
    if "maxItems" in node and len(value) > node["maxItems"]:
        yield f"{path}: Too many: {len(value)}: must have at most {node['maxItems']} items"
    if "minItems" in node and len(value) < node["minItems"]:
        yield f"{path}: Too few: {len(value)}: must have at least {node['minItems']} items"
    items = node.get("items")
    if isinstance(items, Mapping):
        for index, item in enumerate(value):
            yield from _check(item, items, f"{path}[{index}]")


def _check_string(value: str, node: Node, path: str) -> Iterator[str]:
    enum = node.get("enum")
    if enum and value not in enum:
        near = nearest(value, [str(e) for e in enum])
        hint = f"; did you mean {near!r}?" if near else ""
        shown = ", ".join(repr(e) for e in enum)
        yield f"{path}: Unsupported value: {value!r}: supported values: {shown}{hint}"
    if "maxLength" in node and len(value) > node["maxLength"]:
        yield f"{path}: Too long: may not be more than {node['maxLength']} bytes"
    if "minLength" in node and len(value) < node["minLength"]:
        yield f"{path}: Invalid value: {value!r}: at least {node['minLength']} characters"
    pattern = node.get("pattern")
    if pattern and not re.search(pattern, value):
        yield f"{path}: Invalid value: {value[:100]!r}: should match {pattern!r}"


def _check_number(value: float, node: Node, path: str) -> Iterator[str]:
    if "minimum" in node and value < node["minimum"]:
        yield f"{path}: Invalid value: {value}: must be greater than or equal to {node['minimum']}"
    if "maximum" in node and value > node["maximum"]:
        yield f"{path}: Invalid value: {value}: must be less than or equal to {node['maximum']}"
    enum = node.get("enum")
    if enum and value not in enum:
        yield f"{path}: Unsupported value: {value}: supported values: {enum}"
