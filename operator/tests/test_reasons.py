"""Every condition reason is an API: it lives in api/constants.py, never as a literal."""

from __future__ import annotations

import ast
import pathlib

from kimik3_operator.api.constants import Reason

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "kimik3_operator"
# Where each constructor takes its reason.
REASON_POSITION = {"Condition": 2, "Finding": 2, "ProbeState": 1, "Problem": 0}


def literal_reasons() -> list[str]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "probe_script.py":  # runs alone inside the serving image
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            position = REASON_POSITION.get(node.func.id)
            if position is None or len(node.args) <= position:
                continue
            arg = node.args[position]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append(f"{path.name}:{node.lineno} {arg.value}")
    return found


def test_no_reason_is_written_as_a_string_literal() -> None:
    assert literal_reasons() == []


def test_reasons_are_camel_case_and_unique() -> None:
    values = [v for k, v in vars(Reason).items() if k.isupper()]
    assert len(values) == len(set(values))
    assert all(v[0].isupper() and v.isalnum() for v in values)
