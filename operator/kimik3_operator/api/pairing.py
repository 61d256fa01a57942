"""Pairs a target checkpoint with its speculative drafter.

A text-only target with no drafter given, or ``method: dspark`` without a repo, gets the
DSpark drafter known for that target. Values are the Kimi-K3 recipe's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kimik3_operator.api.types import (
    DrafterMethod,
    DrafterSpec,
    RejectionSampleMethod,
    SampleMethod,
)


@dataclass(frozen=True)
class KnownDrafter:
    repo: str
    method: DrafterMethod
    num_speculative_tokens: int
    draft_sample_method: SampleMethod
    rejection_sample_method: RejectionSampleMethod


KNOWN_DRAFTERS: Final[dict[str, KnownDrafter]] = {
    "moonshotai/Kimi-K3": KnownDrafter(
        repo="RedHatAI/Kimi-K3-speculator.dspark",
        method="dspark",
        num_speculative_tokens=8,
        draft_sample_method="probabilistic",
        rejection_sample_method="block",
    ),
}


# (architecture, model_type) from the config.json of the public Kimi-K3 drafters, so the
# static stage can judge the method before the probe reads the real file.
KNOWN_DRAFTER_CONFIGS: Final[dict[str, tuple[str, str]]] = {
    "RedHatAI/Kimi-K3-speculator.dspark": ("K3DSparkModel", "k3_dspark"),
    "Inferact/Kimi-K3-DSpark": ("K3DSparkModel", "k3_dspark"),
}
# The Kimi-K3 checkpoint's own model_type: what mtp drafts from when no drafter is named.
TARGET_MODEL_TYPE: Final = "kimi_k3"
# Where a drafter read from a volume (spec.drafter.source.pvc) is mounted in the pods.
DRAFTER_MOUNT: Final = "/drafter"


@dataclass(frozen=True)
class ResolvedDrafter:
    """The drafter a deployment will run with, after pairing."""

    method: DrafterMethod
    repo: str
    revision: str
    num_speculative_tokens: int | None
    draft_tensor_parallel_size: int | None
    draft_sample_method: SampleMethod | None
    rejection_sample_method: RejectionSampleMethod | None
    auto_paired: bool
    # The drafter's directory in the pods when it is read from a volume (else "").
    path: str = ""

    @property
    def location(self) -> str:
        """Where vLLM reads the drafter: its directory on the volume, or its repo."""
        return self.path or self.repo

    def speculative_config(self) -> dict[str, object]:
        """The JSON of ``--speculative-config``, with the method always explicit."""
        config: dict[str, object] = {"method": self.method}
        if self.path:
            config["model"] = self.path
        elif self.repo:
            config["model"] = self.repo
            if self.revision and self.revision != "main":
                config["revision"] = self.revision
        optional = {
            "num_speculative_tokens": self.num_speculative_tokens,
            "draft_tensor_parallel_size": self.draft_tensor_parallel_size,
            "draft_sample_method": self.draft_sample_method,
            "rejection_sample_method": self.rejection_sample_method,
        }
        config.update({k: v for k, v in optional.items() if v is not None})
        return config


def resolve_drafter(model_repo: str, drafter: DrafterSpec) -> ResolvedDrafter | None:
    """The drafter to run, or None for ``method: none``. Read it as ``spec.paired_drafter``,
    which resolves it once per parsed spec.

    A method that needs a separate drafter checkpoint but has no repo and no known
    pairing keeps an empty repo; the preflight reports that as ``DrafterNotFound``.
    """
    if drafter.method == "none":
        return None
    known = KNOWN_DRAFTERS.get(model_repo)
    named = drafter.repo or drafter.source is not None
    if named or drafter.method == "mtp" or known is None or known.method != drafter.method:
        pvc = drafter.source.pvc if drafter.source is not None else None
        return ResolvedDrafter(
            method=drafter.method,
            repo=drafter.repo,
            revision=drafter.revision,
            num_speculative_tokens=drafter.num_speculative_tokens,
            draft_tensor_parallel_size=drafter.draft_tensor_parallel_size,
            draft_sample_method=drafter.draft_sample_method,
            rejection_sample_method=drafter.rejection_sample_method,
            auto_paired=False,
            path=f"{DRAFTER_MOUNT}/{pvc.path.strip('/')}".rstrip("/") if pvc else "",
        )
    return ResolvedDrafter(
        method=known.method,
        repo=known.repo,
        revision=drafter.revision,
        num_speculative_tokens=drafter.num_speculative_tokens or known.num_speculative_tokens,
        draft_tensor_parallel_size=drafter.draft_tensor_parallel_size,
        draft_sample_method=drafter.draft_sample_method or known.draft_sample_method,
        rejection_sample_method=drafter.rejection_sample_method or known.rejection_sample_method,
        auto_paired=True,
    )
