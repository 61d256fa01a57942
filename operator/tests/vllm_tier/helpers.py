"""The cached virtual environment with the real vllm package."""

from __future__ import annotations

import os
import pathlib
import subprocess
from functools import cache

ROOT = pathlib.Path(__file__).resolve().parents[3]


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
