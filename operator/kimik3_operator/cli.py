"""The ``kimik3`` command: run the operator, render the children of a resource offline."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from kimik3_operator.api import constants as c
from kimik3_operator.api.spec import SpecError, parse_spec
from kimik3_operator.builders.children import build_children
from kimik3_operator.builders.common import Owner


def load_resource(path: str) -> dict[str, Any]:
    """The one KimiK3Deployment in a YAML file ('-' for standard input)."""
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    docs = [d for d in yaml.safe_load_all(text) if d]
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == c.KIND]
    if len(found) != 1:
        raise ValueError(f"{path}: expected one {c.KIND}, found {len(found)}")
    return found[0]


def render(resource: dict[str, Any]) -> list[dict[str, Any]]:
    meta = resource.get("metadata", {}) or {}
    owner = Owner(
        meta.get("name", "kimi-k3"),
        meta.get("namespace", "default"),
        meta.get("uid", "00000000-0000-0000-0000-000000000000"),
    )
    spec = parse_spec(resource.get("spec"))
    return build_children(spec, owner)


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        children = render(load_resource(args.file))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        kind = "invalid spec" if isinstance(exc, SpecError) else "cannot read"
        print(f"kimik3 render: {kind}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(children, sort_keys=False))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import kopf

    from kimik3_operator.config import Settings
    from kimik3_operator.handlers import kopf_handlers  # noqa: F401 - registers handlers

    settings = Settings.from_env()
    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=not settings.peering_name,
        peering_name=settings.peering_name or None,
        liveness_endpoint=settings.health_endpoint,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimik3", description="Serve Kimi-K3 with vLLM on Kubernetes."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator (kopf run -m kimik3_operator)")
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=_cmd_run)
    rend = sub.add_parser("render", help="print the children the operator would apply")
    rend.add_argument("-f", "--file", required=True, help="a KimiK3Deployment YAML ('-': stdin)")
    rend.set_defaults(func=_cmd_render)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
