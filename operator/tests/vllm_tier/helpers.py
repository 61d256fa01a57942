"""The cached virtual environment with the real vllm package, and the runs of scripts in it."""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import select
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from functools import cache
from typing import IO, Any

from kimik3_operator.programs.probe import GPU_NODE_ENVIRONMENT

ROOT = pathlib.Path(__file__).resolve().parents[3]
ZYGOTE = pathlib.Path(__file__).with_name("zygote.py")
# What every script of the tier imports first: vLLM's engine arguments pull in its
# configuration, torch and transformers (about 35 s of CPU on a 2-core machine).
PRELOAD = ("vllm.engine.arg_utils",)


@cache
def vllm_python() -> str:
    """Its python (built on first use by scripts/vllm-venv.sh, reused after)."""
    explicit = os.environ.get("KIMIK3_VLLM_PYTHON")
    if explicit:
        return explicit
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-venv.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


class _Zygote:
    """One zygote.py process: vLLM imported once in one environment."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.process = subprocess.Popen(
            [vllm_python(), str(ZYGOTE), *PRELOAD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **self.env},
        )
        ready = self._answer(900)
        if ready != {"ready": True}:
            raise RuntimeError(f"the vLLM zygote did not start: {ready}")

    @property
    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def _answer(self, timeout: float) -> dict[str, Any] | None:
        out = self._pipes[1]
        if not select.select([out], [], [], timeout)[0]:
            return None
        line = out.readline()
        if not line:
            raise RuntimeError(f"the vLLM zygote exited ({self.process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(
        self, argv: Sequence[str], stdin: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="vllm-run-") as work:
            files = {name: pathlib.Path(work) / name for name in ("stdin", "stdout", "stderr")}
            if stdin is not None:
                files["stdin"].write_text(stdin)
            request = {
                "argv": list(argv),
                "cwd": os.getcwd(),
                "stdin": str(files["stdin"]) if stdin is not None else None,
                "stdout": str(files["stdout"]),
                "stderr": str(files["stderr"]),
            }
            self._pipes[0].write(json.dumps(request) + "\n")
            self._pipes[0].flush()
            started = self._answer(60)
            if started is None:
                raise RuntimeError("the vLLM zygote did not start the run")
            ended = self._answer(timeout)
            if ended is None:
                os.kill(started["pid"], signal.SIGKILL)
                self._answer(60)
                raise subprocess.TimeoutExpired(list(argv), timeout)
            return subprocess.CompletedProcess(
                list(argv),
                int(ended["returncode"]),
                files["stdout"].read_text(errors="replace"),
                files["stderr"].read_text(errors="replace"),
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_held: list[_Zygote] = []


def _stop_held() -> None:
    while _held:
        _held.pop().stop()


atexit.register(_stop_held)


def run_vllm(
    argv: Sequence[str | os.PathLike[str]],
    *,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARG...`` in the vllm venv, as subprocess.run(..., capture_output=True,
    text=True) would return it, in the environment the probe sets before vLLM's import (a
    fork that starts with vLLM imported must have had it at the import) with ``env`` over it.
    The script runs in a fork of a process that imported vLLM in that same environment. One
    such process is held at a time (each holds about a GB): a run in another environment
    replaces it."""
    wanted = {**GPU_NODE_ENVIRONMENT, **(env or {})}
    if _held and _held[0].env != wanted:
        _stop_held()
    if not _held:
        _held.append(_Zygote(wanted))
    return _held[0].run([str(a) for a in argv], input, timeout)


def run_differential(argv: list[str], env: Mapping[str, str]) -> None:
    """bench/differential.py's runner for this tier: the probe's --differential in a fork."""
    result = run_vllm(argv, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
