"""Runs inside the vllm virtual environment: imports vLLM once, then runs each script it is
asked to in a fork of itself. The tier's scripts each import vLLM (about 35 s of CPU on a
2-core machine, most of a run); forked from here, a run starts with the modules imported, in
the same environment it would have imported them in (the helper starts one of these per
environment), and is otherwise a process of its own: its argv, stdin, stdout, stderr, working
directory, exit code and whatever vLLM state it sets.

Usage: zygote.py MODULE...  (the modules to import first). Protocol, one JSON object per line:
it prints {"ready": true} once imported; then for each request read from stdin,
{"argv": [script, arg...], "cwd": dir, "stdin": file or null, "stdout": file, "stderr": file},
it prints {"pid": pid} when the run has started and {"returncode": code} when it has ended.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import sys
import traceback
from typing import Any


def _run(request: dict[str, Any], channel: tuple[int, int]) -> int:
    """In the fork: the script as ``python SCRIPT ARG...`` would run it."""
    for fd in channel:
        os.close(fd)
    os.chdir(request["cwd"])
    for fd, path, flags in (
        (0, request.get("stdin") or os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:  # as the interpreter does with sys.exit("message")
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def main() -> None:
    for module in sys.argv[1:]:
        importlib.import_module(module)
    # The protocol on descriptors of its own: 0, 1 and 2 become each run's.
    requests, answers = os.dup(0), os.dup(1)
    reader = os.fdopen(requests, "r")
    writer = os.fdopen(answers, "w")

    def say(message: dict[str, Any]) -> None:
        writer.write(json.dumps(message) + "\n")
        writer.flush()

    say({"ready": True})
    for line in reader:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _run(request, (requests, answers))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        say({"returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
