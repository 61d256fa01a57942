"""The capability table (data/capabilities.json) and vLLM version arithmetic."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

Version = tuple[int, int, int]
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str) -> Version | None:
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def format_version(version: Version) -> str:
    return ".".join(str(p) for p in version)


def image_tag(image: str) -> str | None:
    """The tag of an image reference; None for a digest or no tag."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


@dataclass(frozen=True)
class ResolvedVersion:
    version: Version | None
    source: str  # "engine.version", "image tag", or why it is unknown


# What may follow X.Y.Z in a tag or a version (PEP 440's forms, as vLLM's wheels and images
# spell them): a pre-release (a, b, rc, dev: code before the release), a post release (code
# after it), then a build variant or local label (-cu130, +cu130: the release's own code).
_SUFFIX = re.compile(
    r"^(?:[.-]?(?P<pre>a|alpha|b|beta|rc|c|dev)[.-]?\d*|[.-]?(?P<post>post)[.-]?\d*)*"
    r"(?:[-+_].*)?$"
)
_KIND = {
    "a": "an alpha",
    "alpha": "an alpha",
    "b": "a beta",
    "beta": "a beta",
    "dev": "a dev build",
}


def release_of(text: str) -> tuple[Version | None, str | None]:
    """The release ``text`` (a tag or a version) is, and why it is not one the table can
    stand for: a pre-release of X.Y.Z is older code than X.Y.Z, a post release newer. A build
    variant or local label (``-cu130``, ``+cu130``) is the release itself."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None, f"{text!r} is not a vLLM version"
    version: Version = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    rest = text.strip()[match.end() :]
    suffix = _SUFFIX.match(rest)
    shown = format_version(version)
    if suffix is None:
        return None, f"{text!r} is not a vLLM version"
    if suffix.group("pre"):
        kind = _KIND.get(suffix.group("pre"), "a release candidate")
        return None, f"{text!r} is {kind} of {shown}, older code than the {shown} release"
    if suffix.group("post"):
        return None, f"{text!r} is a post release of {shown}, newer code than the {shown} release"
    return version, None


def resolve_version(engine_version: str, image: str) -> ResolvedVersion:
    if engine_version:
        version, why = release_of(engine_version)
        return ResolvedVersion(version, f"engine.version: {why}" if why else "engine.version")
    tag = image_tag(image)
    if tag is None:
        return ResolvedVersion(None, f"image {image!r} has no tag (a digest or none)")
    version, why = release_of(tag)
    if version is None:
        return ResolvedVersion(None, f"image tag {why}")
    return ResolvedVersion(version, "image tag")


@dataclass(frozen=True)
class CapabilityTable:
    data: dict[str, Any]

    @property
    def first_release(self) -> Version:
        found = parse_version(self.data["firstKimiK3Release"])
        assert found is not None
        return found

    @property
    def releases(self) -> list[Version]:
        parsed = (parse_version(v) for v in self.data["releases"])
        return sorted(v for v in parsed if v is not None)

    def release(self, version: Version) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.data["releases"].get(format_version(version))
        return found

    def target(self, version: Version, architecture: str, platform: str) -> dict[str, Any] | None:
        release = self.release(version) or {}
        entry = release.get("architectures", {}).get(architecture)
        # A GQA class is judged with its config.json (rules.check_architecture).
        if entry is None or not (entry.get("servesKimiK3") or entry.get("attention") == "gqa"):
            return None
        found: dict[str, Any] | None = entry.get("platforms", {}).get(platform)
        return found

    def first_release_where(self, predicate: Any) -> Version | None:
        return next((v for v in self.releases if predicate(v)), None)


@cache
def load_table() -> CapabilityTable:
    text = resources.files("kimik3_operator").joinpath("data/capabilities.json").read_text()
    return CapabilityTable(json.loads(text))
