"""The ``kimik3`` command: run the operator, render the children of a resource offline."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import yaml

from kimik3_operator.api import constants as c
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.schema_check import schema_errors
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.children import ALL_PARTS, Part, desired_children
from kimik3_operator.builders.common import Owner
from kimik3_operator.observation.pod_security import LEVELS, Level, Policy


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


def _owner(resource: dict[str, Any], namespace: str = "") -> Owner:
    meta = resource.get("metadata", {}) or {}
    return Owner(
        meta.get("name", "kimi-k3"),
        namespace or meta.get("namespace") or "default",
        meta.get("uid", "00000000-0000-0000-0000-000000000000"),
    )


def checked_resource(path: str, namespace: str = "") -> dict[str, Any]:
    """The resource in ``path``, refused as ``kubectl apply`` refuses it (the CRD's schema,
    then the rules of parse_spec); ``namespace`` as kubectl's -n (a different one in the
    file is an error, as there)."""
    resource = load_resource(path)
    problems = schema_errors(resource)
    if problems:
        raise ValueError("; ".join(problems))
    meta = resource.get("metadata") or {}
    if namespace and meta.get("namespace") and meta["namespace"] != namespace:
        raise ValueError(
            f"metadata.namespace {meta['namespace']!r} does not match -n {namespace!r}"
        )
    return resource


def static_verdict(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """The static preflight with the checkpoints' configs the spec gives: what the operator
    judges before any child."""
    from kimik3_operator.preflight.gate import given_facts
    from kimik3_operator.preflight.report import report
    from kimik3_operator.preflight.rules import run_rules
    from kimik3_operator.preflight.table import load_table

    result: dict[str, Any] = report(run_rules(spec, given_facts(spec, load_table())))
    return result


def render(
    resource: dict[str, Any], namespace: str = "", verdict: str = "Pass"
) -> list[dict[str, Any]]:
    """Every child the operator applies for ``resource``, in its order: the probe's
    ConfigMap and Job (unless the preflight is off or refused the spec), the model cache's
    claim, ConfigMap and Job, then the LeaderWorkerSet, its Service and PodMonitor (which the
    operator holds back until the probe and the cache are done)."""
    owner = _owner(resource, namespace)
    spec = parse_spec(resource.get("spec"))
    parts: tuple[Part, ...] = ALL_PARTS if verdict != "Fail" else ("cache", "groups", "serving")
    return desired_children(spec, owner, parts=parts)


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        resource = checked_resource(args.file, args.namespace)
        verdict = static_verdict(parse_spec(resource.get("spec")))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        kind = "cannot read" if isinstance(exc, OSError | yaml.YAMLError) else "invalid spec"
        print(f"kimik3 render: {kind}: {exc}", file=sys.stderr)
        return 1
    if verdict["verdict"] == "Fail" and not args.force:
        print("kimik3 render: the preflight refuses this spec; the operator would create no "
              "GPU pod (--force renders it anyway):", file=sys.stderr)  # fmt: skip
        _print_verdict(verdict, sys.stderr)
        return 2
    children = render(resource, args.namespace, verdict["verdict"])
    sys.stdout.write(yaml.safe_dump_all(children, sort_keys=False))
    return 0


def _print_verdict(result: Mapping[str, Any], out: TextIO) -> None:
    print(f"verdict: {result['verdict']}", file=out)
    for check in result["checks"]:
        line = f"  {check['status']:<7} {check['id']:<22} {check['reason']}: {check['message']}"
        print(line, file=out)


def _read_config(directory: str | None) -> dict[str, Any] | None:
    if directory is None:
        return None
    path = pathlib.Path(directory)
    path = path / "config.json" if path.is_dir() else path
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def _cmd_preflight(args: argparse.Namespace) -> int:
    from kimik3_operator.preflight.facts import drafter_facts, target_facts
    from kimik3_operator.preflight.gate import given_facts
    from kimik3_operator.preflight.report import report
    from kimik3_operator.preflight.rules import Facts, run_rules
    from kimik3_operator.preflight.table import load_table

    try:
        resource = checked_resource(args.file, args.namespace)
        spec = parse_spec(resource.get("spec"))
        model_config = _read_config(args.model_config)
        drafter_config = _read_config(args.drafter_config)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"kimik3 preflight: unusable input: {exc}", file=sys.stderr)
        return 1
    # A file on the command line is read in place of the spec's config.
    given = given_facts(spec, load_table())
    facts = Facts(
        given.table,
        target=target_facts(model_config, f"{args.model_config}/config.json")
        if model_config is not None
        else given.target,
        drafter=drafter_facts(drafter_config, f"{args.drafter_config}/config.json")
        if drafter_config is not None
        else given.drafter,
    )
    result = report(run_rules(spec, facts))
    if args.pod_security:
        result = _with_pod_security(result, resource, spec, args.pod_security)
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        _print_verdict(result, sys.stdout)
    return {"Pass": 0, "Fail": 2, "NeedsProbe": 3}[result["verdict"]]


def _with_pod_security(
    result: dict[str, Any], resource: dict[str, Any], spec: KimiK3DeploymentSpec, level: Level
) -> dict[str, Any]:
    """The preflight's report with the Pod Security check the operator makes against the
    namespace's enforced level: a refusal fails the verdict, as it blocks the deployment."""
    from kimik3_operator.controller.admission import predict

    owner = _owner(resource)
    refusal = predict(spec, owner, Policy(level))
    check: dict[str, Any] = {
        "id": "PodSecurity",
        "status": "Pass",
        "reason": str(c.Reason.POD_SECURITY_ADMITTED),
        "message": f"a namespace enforcing Pod Security {level} admits every pod of this spec",
    }
    if refusal is not None:
        check.update(
            status="Fail",
            reason=str(c.Reason.POD_SECURITY_REFUSED),
            message=refusal.message(owner.namespace),
        )
        result = {**result, "verdict": "Fail"}
    return {**result, "checks": [*result["checks"], check]}


def _cmd_status(args: argparse.Namespace) -> int:
    from kimik3_operator.kube import ApiKube
    from kimik3_operator.status_view import render_status

    try:
        kube = ApiKube.from_environment()
        namespace = args.namespace or _current_namespace()
        body = kube.get(c.API_VERSION, c.KIND, args.name, namespace)
    except Exception as exc:  # reaching a cluster fails in many ways; say which and stop
        print(f"kimik3 status: {exc}", file=sys.stderr)
        return 1
    if body is None:
        print(f"kimik3 status: {c.KIND} {namespace}/{args.name} not found", file=sys.stderr)
        return 1
    print(render_status(body))
    return 0


def _current_namespace() -> str:
    import kubernetes

    try:
        _, context = kubernetes.config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
    except Exception:  # in a pod, or no kubeconfig
        return "default"
    namespace: str = context.get("context", {}).get("namespace") or "default"
    return namespace


def _refuse_to_start(message: str) -> int:
    """A setting or credential the operator cannot run with: said on stderr and in the
    container's termination message (what `kubectl describe pod` shows), exit 2."""
    text = f"kimik3 run: {message}"
    print(text, file=sys.stderr)
    if os.path.exists("/dev/termination-log"):
        with contextlib.suppress(OSError), open("/dev/termination-log", "w") as log:
            log.write(text)
    return 2


def _cmd_run(args: argparse.Namespace) -> int:
    from kimik3_operator.config import Settings, SettingsError

    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        return _refuse_to_start(str(exc))
    try:
        from kimik3_operator.kube import ApiKube

        ApiKube.from_environment()
    except Exception as exc:  # no service account, no kubeconfig, a kubeconfig that is not one
        return _refuse_to_start(
            f"no way to reach the API server: {type(exc).__name__}: {exc} (in a pod: its "
            "ServiceAccount token; outside: KUBECONFIG or ~/.kube/config)"
        )

    import kopf

    from kimik3_operator import host  # noqa: F401 - registers the handlers

    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        # Leadership is the operator's own Lease (leader.py); kopf's peering is not used.
        standalone=True,
        liveness_endpoint=settings.health_endpoint,
    )
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kimik3-operator")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimik3", description="Serve Kimi-K3 with vLLM on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator (kopf run -m kimik3_operator)")
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=_cmd_run)
    rend = sub.add_parser("render", help="print the children the operator would apply")
    rend.add_argument("-f", "--file", required=True, help="a KimiK3Deployment YAML ('-': stdin)")
    rend.add_argument("-n", "--namespace", default="", help="the namespace, as kubectl's -n")
    rend.add_argument(
        "--force", action="store_true", help="render a spec the preflight refuses (exit 0)"
    )
    rend.set_defaults(func=_cmd_render)
    pre = sub.add_parser(
        "preflight",
        help="check offline whether a resource can start (exit 0 pass, 2 fail, 3 needs probe)",
    )
    pre.add_argument("-f", "--file", required=True, help="a KimiK3Deployment YAML ('-': stdin)")
    pre.add_argument("-n", "--namespace", default="", help="the namespace, as kubectl's -n")
    pre.add_argument("--model-config", help="the target's config.json, or its directory")
    pre.add_argument("--drafter-config", help="the drafter's config.json, or its directory")
    pre.add_argument(
        "--pod-security",
        choices=LEVELS,
        help="the Pod Security level the namespace enforces "
        "(its pod-security.kubernetes.io/enforce label): fail if it would refuse a pod",
    )
    pre.add_argument("-o", "--output", choices=("text", "json"), default="text")
    pre.set_defaults(func=_cmd_preflight)
    stat = sub.add_parser("status", help="conditions and acceptance by position of a resource")
    stat.add_argument("name")
    stat.add_argument("-n", "--namespace", default="")
    stat.set_defaults(func=_cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
