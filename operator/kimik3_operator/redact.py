"""Credentials out of text before it reaches a status, an event, a message or a log.

What a user puts in ``spec.engine.env`` (an ``HF_ENDPOINT`` or a proxy with
``user:password@``) reaches the probe's errors and the operator's messages; only the
credentials are taken out, so the address stays readable.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# scheme://user:password@ or scheme://token@ (any scheme); the userinfo ends at the first @
# before the host, and never spans a slash or whitespace.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
# user:password@host without a scheme (a proxy setting, a git remote); a colon is what sets
# it apart from an e-mail address.
_BARE_USERINFO = re.compile(r"(?<![\w/@.%+:-])[\w.%+-]+:[^\s/@:]+@(?=[\w.-])")
# Hugging Face tokens, and what follows an authorization scheme (Bearer, Basic), an API-key
# header or a credential in a query string.
_TOKENS = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}\b"
    r"|(?i:(?<=bearer )[A-Za-z0-9._~+/=-]{8,})"
    r"|(?i:(?<=basic )[A-Za-z0-9+/=]{8,})"
)
_KEYED = re.compile(
    r"(?i)(?P<key>\b(?:x-)?api[-_]?key\s*[:=]\s*|\bauthorization\s*[:=]\s*(?:[a-z]+ )?"
    r"|[?&](?:[\w-]*token|[\w-]*api[-_]?key|key|password|passwd|secret|sig|signature|"
    r"credential|x-amz-credential|x-amz-signature)=)"
    r"[^\s&#\"',;]+"
)
HIDDEN = "***"


def redact(text: str) -> str:
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{HIDDEN}@", text)
    text = _BARE_USERINFO.sub(f"{HIDDEN}@", text)
    text = _KEYED.sub(lambda m: f"{m.group('key')}{HIDDEN}", text)
    return _TOKENS.sub(HIDDEN, text)


def redact_tree(value: Any) -> Any:
    """Every string in a JSON-like value, redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_tree(item) for item in value]
    return value


class RedactingFilter(logging.Filter):
    """On a handler: every record leaves with its credentials taken out."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            cleaned_exc = redact(text)
            if cleaned_exc != text:
                record.msg = f"{record.getMessage()}\n{cleaned_exc}"
                record.args, record.exc_info, record.exc_text = None, None, None
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """On every handler of ``logger`` (the root logger by default)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
