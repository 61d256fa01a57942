"""Which ``vllm serve`` flags an ``engine.extraArgs`` entry sets, read the way vLLM reads it.

vLLM's parser turns ``_`` into ``-`` in a flag's name, reads ``--flag.key=value`` as part of
``--flag``'s JSON, and argparse accepts any unambiguous abbreviation of a flag. So an entry
sets an owned flag when its name, so normalised, is the flag itself or a prefix of it.
The CRD states it as two CEL rules (``owned_flag_rules``); a unit test keeps the CRD's rules
equal to them and the end-to-end tests run the spellings against the real API server.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from kimik3_operator.api.constants import OWNED_FLAGS, TRANSFER_FLAGS

# What argparse reads as a value, not an option, in a parser with no numeric options.
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def flag_name(arg: str) -> str | None:
    """The flag an argument names, normalised as vLLM does; None for a value."""
    if not arg.startswith("-"):
        return None
    # vLLM rewrites "_" only in long flags; argparse matches no short flag spelled with "_".
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def owned_flag(arg: str) -> str | None:
    """The owned flag ``arg`` would set (exactly or abbreviated), or None."""
    name = flag_name(arg)
    if name is None:
        return None
    return next((flag for flag in OWNED_FLAGS if flag.startswith(name)), None)


def transfer_flag(arg: str) -> str | None:
    """The KV-transfer flag ``arg`` would set (exactly or abbreviated), or None."""
    name = flag_name(arg)
    if name is None:
        return None
    return next((flag for flag in TRANSFER_FLAGS if flag.startswith(name)), None)


def owned_flag_rules() -> tuple[str, str]:
    """The CRD's CEL rules on one extraArgs entry, within the API server's cost budget
    (which a rewrite of "_" to "-" in CEL exceeds): no flag name spelled with "_" at all,
    and no name that is an owned flag or a prefix of one. Together they refuse every
    argument ``owned_flag`` finds, and also "_" spellings of flags the operator does not own."""
    listed = ", ".join(f"'{flag}'" for flag in OWNED_FLAGS)
    name = "self.find('^[^=.]*')"
    return (
        f"!(self.startsWith('-') && {name}.contains('_'))",
        f"!(self.startsWith('-') && [{listed}].exists(f, f.startsWith({name})))",
    )


def serve_flag_problem(arg: str, known: Collection[str]) -> str | None:
    """Why `vllm serve`'s parser, whose option strings are ``known``, refuses ``arg``; None
    when it takes it (a value, the flag itself, or the abbreviation of exactly one long
    flag), or when argparse's reading of a short cluster such as ``-q8`` is the image's to
    judge."""
    name = flag_name(arg)
    if name is None or arg == "--" or NEGATIVE_NUMBER.match(arg.split("=", 1)[0]):
        return None
    if name in known:
        return None
    if not name.startswith("--"):
        # argparse reads "-xVALUE" as the short flag -x with a value attached, and "-x" as an
        # abbreviation of a longer single-dash flag.
        shorts = [flag for flag in known if not flag.startswith("--")]
        if any(name.startswith(flag) or flag.startswith(name) for flag in shorts):
            return None
        return f"{name} is not a flag"
    matches = sorted(flag for flag in known if flag.startswith(name))
    if len(matches) == 1:
        return None
    if matches:
        return f"{name} is ambiguous ({', '.join(matches[:4])}{', …' if len(matches) > 4 else ''})"
    return f"{name} is not a flag"
