"""Kimi-K3 on vLLM, as a Kubernetes operator."""

import sys

__version__ = "0.1.0"

# `kopf run -m kimik3_operator` imports this package with kopf already loaded: register the
# handlers then, and keep plain imports (the CLI's render and preflight) free of kopf.
if "kopf" in sys.modules:
    from kimik3_operator import host  # noqa: F401
