"""What each speculative method does to a drafter's architecture, as vLLM does it.

vLLM does not load a drafter under the architecture in its config.json: ``eagle``,
``eagle3`` and ``dflash`` wrap the config in ``EAGLEConfig``, which renames the architecture
(``K3DSparkModel`` becomes ``Eagle3K3DSparkModel`` under eagle3); ``dspark`` keeps only the
DSpark classes it knows and turns any other drafter into DeepSeek-V4's ``DSparkDraftModel``;
``mtp`` needs an MTP model type, after renaming the target's own (``kimi_k3`` becomes
``kimi_k3_mtp``). The rules are read from each wheel's source by the generator
(``extract_methods``) and applied here, pure, to the drafter a spec names.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RENAMING_METHODS = ("eagle", "eagle3", "dflash")


@dataclass(frozen=True)
class Verdict:
    """How vLLM would load a drafter under a method."""

    method: str
    architecture: str  # what the drafter's config.json says
    becomes: str  # what vLLM asks its registry for
    loadable: bool
    why: str  # for a refusal: vLLM's reason, in words


def _renamed(rule: Mapping[str, Any], architecture: str) -> str:
    keep = (
        architecture in rule.get("unlessEquals", [])
        or any(architecture.startswith(p) for p in rule.get("unlessStartsWith", []))
        or any(architecture.endswith(s) for s in rule.get("unlessEndsWith", []))
    )
    return architecture if keep else f"{rule['prefix']}{architecture}"


def judge(
    release: Mapping[str, Any], method: str, architecture: str, model_type: str | None
) -> Verdict | None:
    """The verdict for one drafter under one method, or None when the table cannot say."""
    methods = release.get("speculativeMethods") or {}
    registered = set(release.get("speculativeArchitectures") or [])
    rule = methods.get(method)
    if rule is None:
        return None
    if method in RENAMING_METHODS:
        becomes = _renamed(rule, architecture)
        return Verdict(
            method,
            architecture,
            becomes,
            becomes in registered,
            f"vLLM's {method} loads it as {becomes}, which its model registry does not have",
        )
    if method == "dspark":
        if rule.get("keepsAll") or architecture in rule.get("keeps", []):
            return Verdict(
                method,
                architecture,
                architecture,
                architecture in registered,
                f"vLLM's model registry does not have {architecture}",
            )
        becomes = rule.get("otherwiseBecomes", "DSparkDraftModel")
        return Verdict(
            method,
            architecture,
            becomes,
            False,
            f"vLLM's dspark does not know {architecture} as a DSpark drafter and loads it as "
            f"{becomes}, DeepSeek-V4's drafter, which cannot serve this model",
        )
    if method == "mtp":
        renamed = (rule.get("modelTypeRenames") or {}).get(model_type or "") or {}
        effective = renamed.get("modelType", model_type or "")
        becomes = renamed.get("architecture") or architecture
        return Verdict(
            method,
            architecture,
            becomes,
            effective in rule.get("modelTypes", []) and becomes in registered,
            f"vLLM's mtp needs an MTP model type and model_type {model_type!r} is none "
            "(vLLM: Unsupported speculative method: 'mtp')",
        )
    return None


def methods_that_load(
    release: Mapping[str, Any],
    architecture: str,
    model_type: str | None,
    offered: tuple[str, ...] = ("dspark", "eagle3", "dflash", "mtp"),
) -> list[str]:
    """The methods (of those the API offers) under which vLLM would load this drafter."""
    found = []
    for method in offered:
        verdict = judge(release, method, architecture, model_type)
        if verdict is not None and verdict.loadable:
            found.append(method)
    return found


# The Kimi-K3 drafters the table spells out per platform: the DSpark drafter, and the
# target itself (what mtp drafts from).
TRACKED_DRAFTERS = (("K3DSparkModel", "k3_dspark"), ("KimiLinearForCausalLM", "kimi_k3"))


def acceptance_by_platform(release: Mapping[str, Any]) -> dict[str, Any]:
    """Per platform, method and tracked drafter: what vLLM loads and whether it can, where a
    Kimi-K3 drafter class is implemented only on some platforms."""
    drafters = release.get("drafters") or {}
    table: dict[str, Any] = {}
    for platform in ("nvidia", "amd"):
        per_method: dict[str, Any] = {}
        for method in sorted(release.get("speculativeMethods") or {}):
            answers = {}
            for architecture, model_type in TRACKED_DRAFTERS:
                verdict = judge(release, method, architecture, model_type)
                if verdict is None:
                    continue
                where = (drafters.get(verdict.becomes) or {}).get("platforms")
                answers[architecture] = {
                    "becomes": verdict.becomes,
                    "loadable": verdict.loadable and (where is None or platform in where),
                }
            per_method[method] = answers
        table[platform] = per_method
    return table


# --- the generator's side: reading the rules from a wheel's source ----------------------


def _constants(node: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _keep_condition(test: ast.expr) -> dict[str, list[str]]:
    """startswith/endswith/== constants in the condition under which a name is kept."""
    rule: dict[str, list[str]] = {"unlessStartsWith": [], "unlessEndsWith": [], "unlessEquals": []}
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            where = {"startswith": "unlessStartsWith", "endswith": "unlessEndsWith"}
            if node.func.attr in where:
                rule[where[node.func.attr]] += _constants(node.args[0])
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.Eq):
            rule["unlessEquals"] += _constants(node.comparators[0])
    return rule


def eagle_renames(source: str) -> dict[str, dict[str, Any]]:
    """Per method, EAGLEConfig's renaming: a prefix unless the name already qualifies."""
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEConfig")
    rules: dict[str, dict[str, Any]] = {}
    for node in ast.walk(cls):
        if not (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and ast.unparse(node.test.left) == "method"
        ):
            continue
        method = _constants(node.test.comparators[0])
        comp = next(
            (n for n in ast.walk(ast.Module(node.body, [])) if isinstance(n, ast.ListComp)), None
        )
        if not method or comp is None or not isinstance(comp.elt, ast.IfExp):
            continue
        choice = comp.elt
        if isinstance(choice.orelse, ast.JoinedStr):
            renamed, keep = choice.orelse, choice.test
        elif isinstance(choice.body, ast.JoinedStr) and isinstance(choice.test, ast.UnaryOp):
            renamed, keep = choice.body, choice.test.operand
        else:
            raise ValueError(f"EAGLEConfig's {method[0]} renaming has an unknown shape")
        prefix = _constants(renamed.values[0])[0]
        rules[method[0]] = {"prefix": prefix, **_keep_condition(keep)}
    return rules


def _module_strings(tree: ast.Module) -> dict[str, str]:
    return {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value.value, str)
    }


def dspark_rule(source: str) -> dict[str, Any]:
    """The DSpark classes dspark keeps, and what it turns every other drafter into."""
    tree = ast.parse(source)
    names = _module_strings(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        if "self.method == 'dspark'" not in test or "not in self.draft_model_config" not in test:
            continue
        assigns = [
            n
            for stmt in node.body
            for n in ast.walk(stmt)
            if isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Attribute)
            and n.targets[0].attr == "architectures"
        ]
        if not assigns:
            continue
        keeps: list[str] = []
        for cmp in ast.walk(node.test):
            if isinstance(cmp, ast.Compare) and isinstance(cmp.ops[0], ast.NotIn):
                left = cmp.left
                if isinstance(left, ast.Constant) and isinstance(left.value, str):
                    keeps.append(left.value)
                elif isinstance(left, ast.Name) and left.id in names:
                    keeps.append(names[left.id])
        value = assigns[0].value
        element = value.elts[0] if isinstance(value, ast.List) else value
        fallback = element.orelse if isinstance(element, ast.IfExp) else element
        return {"keeps": sorted(set(keeps)), "otherwiseBecomes": _constants(fallback)[0]}
    # Releases without the renaming load a dspark drafter under its own architecture.
    return {"keepsAll": True}


def mtp_rule(source: str) -> dict[str, Any]:
    """The MTP model types, and the target model types vLLM renames into one."""
    tree = ast.parse(source)
    model_types: list[str] = []
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "MTPModelTypes"
        ):
            model_types = _constants(node.value)
    renames: dict[str, dict[str, str]] = {}
    override = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "hf_config_override"
    )
    for branch in ast.walk(override):
        if not (isinstance(branch, ast.If) and isinstance(branch.test, ast.Compare)):
            continue
        if ast.unparse(branch.test.left) != "hf_config.model_type":
            continue
        sources = _constants(branch.test.comparators[0])
        target_type = ""
        architecture = ""
        for stmt in branch.body:
            if (
                isinstance(stmt, ast.Assign)
                and ast.unparse(stmt.targets[0]) == "hf_config.model_type"
                and isinstance(stmt.value, ast.Constant)
            ):
                target_type = str(stmt.value.value)
            for call in ast.walk(stmt):
                if isinstance(call, ast.Dict):
                    for key, value in zip(call.keys, call.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "architectures":
                            architecture = next(iter(_constants(value)), "")
        if target_type:
            for source_type in sources:
                if source_type != target_type:
                    entry = {"modelType": target_type}
                    if architecture:
                        entry["architecture"] = architecture
                    renames[source_type] = entry
    return {"modelTypes": sorted(set(model_types)), "modelTypeRenames": renames}


def speculative_architectures(registry_source: str) -> list[str]:
    """The keys of the registry's speculative-decoding table."""
    tree = ast.parse(registry_source)
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if (
            isinstance(target, ast.Name)
            and target.id == "_SPECULATIVE_DECODING_MODELS"
            and isinstance(value, ast.Dict)
        ):
            return sorted(_constants(ast.List([k for k in value.keys if k is not None])))
    raise ValueError("no _SPECULATIVE_DECODING_MODELS in the registry")


def extract_methods(eagle_source: str, speculative_source: str) -> dict[str, Any]:
    methods: dict[str, Any] = dict(eagle_renames(eagle_source))
    methods["dspark"] = dspark_rule(speculative_source)
    methods["mtp"] = mtp_rule(speculative_source)
    return methods


def method_names(speculative_source: str) -> list[str]:
    """Every method name the release's ``SpeculativeMethod`` literal accepts, with the
    literals it nests (``EagleModelTypes``, ``MTPModelTypes``, ...) flattened."""
    literals: dict[str, list[ast.expr]] = {}
    for node in ast.parse(speculative_source).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Subscript)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "Literal"
        ):
            inner = node.value.slice
            items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
            literals[node.targets[0].id] = items

    def flatten(name: str, seen: frozenset[str]) -> set[str]:
        found: set[str] = set()
        for item in literals.get(name, []):
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                found.add(item.value)
            elif isinstance(item, ast.Name) and item.id not in seen:
                found |= flatten(item.id, seen | {item.id})
        return found

    return sorted(flatten("SpeculativeMethod", frozenset({"SpeculativeMethod"})))
