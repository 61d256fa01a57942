"""The operator image, without a container engine: hadolint on the Dockerfile, then its
install steps (build the wheels, install from them alone, run the entry point) in a fresh
virtual environment."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import venv

import pytest

pytestmark = pytest.mark.kwok

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(pathlib.Path(sys.executable).parent / "hadolint")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_as_a_numeric_non_root_user() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert 'ENTRYPOINT ["kimik3"]' in text and 'CMD ["run"]' in text
    final_stage = text.rsplit("FROM ", 1)[1]
    assert "gcc" not in final_stage and "build-essential" not in final_stage


def test_install_steps_in_a_fresh_environment(tmp_path: pathlib.Path) -> None:
    text = DOCKERFILE.read_text()
    wheel_step = re.search(r"RUN (pip wheel [^\n]+)", text)
    install_step = re.search(r"RUN (pip install [^\\\n]+)", text)
    assert wheel_step and install_step
    wheels = tmp_path / "wheels"
    build = tmp_path / "build"
    shutil.copytree(
        ROOT / "operator", build / "operator", ignore=shutil.ignore_patterns("tests", "__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, build / name)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [sys.executable, "-m", *wheel_step.group(1).replace("/wheels", str(wheels)).split()],
        cwd=build,
        check=True,
        env=env,
        capture_output=True,
    )
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    subprocess.run(
        [str(python), "-m", *install_step.group(1).strip().replace("/wheels", str(wheels)).split()],
        check=True,
        env=env,
        capture_output=True,
    )
    kimik3 = target / "bin" / "kimik3"
    assert (
        "run"
        in subprocess.run(
            [str(kimik3), "--help"], check=True, capture_output=True, text=True
        ).stdout
    )
    rendered = subprocess.run(
        [str(kimik3), "render", "-f", str(ROOT / "examples" / "kimi-k3-text-dspark.yaml")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "kind: LeaderWorkerSet" in rendered
    verdict = subprocess.run(
        [
            str(kimik3),
            "preflight",
            "-f",
            str(ROOT / "examples" / "kimi-k3-text-dspark-old-vllm.yaml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verdict.returncode == 2 and "TargetLacksEagle3" in verdict.stdout
    imported = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, check=False)
    assert imported.returncode != 0, "the operator image must not contain vllm"
