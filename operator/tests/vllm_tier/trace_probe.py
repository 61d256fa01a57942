"""Runs inside the vllm virtual environment: the image probe's configuration and construction
steps (probe.differential) on the cases given, recording every function of vLLM's that they
enter. Usage: trace_probe.py PROBE_SCRIPT CASES.json OUT.json; OUT holds the answers and the
functions entered as ``[file under vllm/, qualified name]``."""

from __future__ import annotations

import json
import pathlib
import sys
import threading
from types import FrameType
from typing import Any


def main() -> None:
    script, cases_path, out_path = sys.argv[1:4]
    sys.path.insert(0, str(pathlib.Path(script).parent))
    import probe

    entered: set[tuple[str, str]] = set()

    def record(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        where = probe.vllm_path(code.co_filename)
        if where:
            entered.add((where, code.co_qualname.replace(".<locals>", "")))

    cases = json.loads(pathlib.Path(cases_path).read_text())
    sys.setprofile(record)
    threading.setprofile(record)
    try:
        answers = probe.differential(cases)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    pathlib.Path(out_path).write_text(json.dumps({"answers": answers, "entered": sorted(entered)}))


if __name__ == "__main__":
    main()
