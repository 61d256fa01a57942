"""Which ``vllm serve`` flags an ``engine.extraArgs`` entry sets, read the way vLLM reads it.

vLLM's parser turns ``_`` into ``-`` in a flag's name, reads ``--flag.key=value`` as part of
``--flag``'s JSON, and argparse accepts any unambiguous abbreviation of a flag. So an entry
sets an owned flag when its name, so normalised, is the flag itself or a prefix of it.
The CRD states it as two CEL rules (``owned_flag_rules``); a unit test keeps the CRD's rules
equal to them and the end-to-end tests run the spellings against the real API server.
"""

from __future__ import annotations

from kimik3_operator.api.constants import OWNED_FLAGS, TRANSFER_FLAGS


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
