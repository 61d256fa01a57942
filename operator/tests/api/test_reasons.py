"""Every condition reason is an API: it lives in api/constants.py, never as a literal."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

from kimik3_operator.api.constants import Reason

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "kimik3_operator"
# Where each constructor takes its reason.
MYPY_ARGS = ("--config-file", "", "--strict", "--follow-imports=silent")
REASON_POSITION = {"Condition": 2, "Finding": 2, "ProbeState": 1, "Problem": 0}


def literal_reasons() -> list[str]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "programs" and path.name == "probe.py":  # alone in the image
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
    # @unique on the enum refuses a repeated value at import; an alias would hide one.
    assert len(Reason.__members__) == len(list(Reason))
    assert all(r.value[0].isupper() and r.value.isalnum() for r in Reason)


def test_the_type_check_refuses_a_reason_that_is_not_in_the_vocabulary() -> None:
    snippet = (
        "from kimik3_operator.api.constants import ConditionType, Reason\n"
        "from kimik3_operator.api.conditions import Condition\n"
        "Condition(ConditionType.DEGRADED, 'True', Reason.NAME_CONFLICT, 'fine')\n"
        "Condition(ConditionType.DEGRADED, 'True', 'NameConflcit', 'misspelt')\n"
    )
    # In a process of its own: mypy raises the interpreter's recursion limit.
    run = subprocess.run(
        [sys.executable, "-m", "mypy", *MYPY_ARGS, "-c", snippet],
        capture_output=True,
        text=True,
        check=False,
    )
    out, status = run.stdout, run.returncode
    assert status == 1, out
    assert 'Argument 3 to "Condition" has incompatible type "str"; expected "Reason"' in out
    assert out.count("error:") == 1, out
