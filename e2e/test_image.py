"""The operator image's Dockerfile, without a container engine: hadolint, and the shape of its
stages. Its install steps run for real where the image is built (e2e/runtime/images.sh, with
buildah), and the image runs as the chart's pod, its CLI answering, in
test_real_node.py::test_operator_image_from_the_chart_runs_as_a_pod."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

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
