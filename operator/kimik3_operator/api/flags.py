"""Which ``vllm serve`` flags an ``engine.extraArgs`` entry sets, read the way vLLM reads it.

vLLM's parser turns ``_`` into ``-`` in a flag's name, reads ``--flag.key=value`` as part of
``--flag``'s JSON, and argparse accepts any unambiguous abbreviation of a flag. So an entry
sets an owned flag when its name, so normalised, is the flag itself or a prefix of it.
The CRD states the same test as one regular expression (``owned_flag_pattern``); a unit test
keeps the two in agreement.
"""

from __future__ import annotations

import re
from functools import cache

from kimik3_operator.api.constants import OWNED_FLAGS


def flag_name(arg: str) -> str | None:
    """The flag an argument names, normalised as vLLM does; None for a value."""
    if not arg.startswith("-"):
        return None
    name = arg.split("=", 1)[0].split(".", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def owned_flag(arg: str) -> str | None:
    """The owned flag ``arg`` would set (exactly or abbreviated), or None."""
    name = flag_name(arg)
    if name is None:
        return None
    return next((flag for flag in OWNED_FLAGS if flag.startswith(name)), None)


def _prefixes(flag: str) -> str:
    """A regex for every non-empty prefix of ``flag``, ``-`` after the leading dashes
    also written ``_``."""
    if not re.fullmatch(r"-[-a-z0-9]+", flag):
        raise ValueError(f"owned flag {flag!r} needs escaping in the CRD's pattern")
    lead = len(flag) - len(flag.lstrip("-"))
    parts = list(flag[:lead])
    parts += ["[-_]" if ch == "-" else ch for ch in flag[lead:]]
    pattern = ""
    for part in reversed(parts[1:]):
        pattern = f"(?:{part}{pattern})?"
    return parts[0] + pattern


@cache
def owned_flag_pattern() -> str:
    """What the CRD's CEL rule matches (RE2, whole string): an argument that sets an owned
    flag, exactly, abbreviated, with ``_`` for ``-``, ``=value`` or ``.key=value``."""
    names = "|".join(_prefixes(flag) for flag in OWNED_FLAGS)
    return f"(?s)^(?:{names})(?:[=.].*)?$"
