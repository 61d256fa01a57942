"""Runs inside the vllm virtual environment: the image probe's speculative-config and
command-line checks for many requests in one process (vLLM imports once).

Input (stdin): {"name": request, ...}. Output: {"name": {"speculative": ..., "serve": ...}}.
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(sys.argv[1]).parent))
import probe


def main() -> None:
    cases = json.load(sys.stdin)
    out = {
        name: {
            "speculative": probe.check_speculative(
                request,
                probe.config_dir(request.get("target") or {}),
                probe.config_dir(request.get("drafter") or {}),
            ),
            "serve": probe.check_serve(request.get("serve") or {}),
        }
        for name, request in cases.items()
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
