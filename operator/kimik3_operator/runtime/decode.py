"""JSON from the API server, decoded so that one object nested too deep costs only itself.

The API server stores open objects (fields with ``x-kubernetes-preserve-unknown-fields``) up
to 10,000 levels deep; Python's decoder gives up near 1,000 with a RecursionError, and a
list page or a watch event that cannot be decoded would stop the informer of every tenant.
Such a body is decoded a second time with every container deeper than ``MAX_DEPTH``
replaced by the string ``TOO_DEEP``; the informer then skips the objects that hold it.
The fast path is the standard decoder: the rescan runs only for a body it refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

ObjectHook = Callable[[dict[str, Any]], Any]

# Far deeper than any Kubernetes object the operator reads (a pod's spec is about 12 levels,
# its managedFields about 20), far shallower than what exhausts the decoder.
MAX_DEPTH = 100
# One object inside a body: what the CRD's closed fields allow, many times over.
OBJECT_LIMIT = 64
TOO_DEEP = f"\x00kimik3: nested deeper than {MAX_DEPTH} levels"
# A JSON string (escapes included) or one bracket: what the rescan needs to know the depth.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_QUOTE = ord('"')
_OPENERS = frozenset(b"[{")


def loads(body: bytes | str, object_hook: ObjectHook | None = None) -> tuple[Any, bool]:
    """The decoded body, and whether any part of it was cut at ``MAX_DEPTH``.

    ``object_hook`` sees each JSON object as soon as it is decoded, innermost first: what it
    returns takes the object's place, so a reader that keeps a few fields of each holds one
    object's worth at a time, not a page's."""
    try:
        return json.loads(body, object_hook=object_hook), False
    except RecursionError:
        raw = body.encode() if isinstance(body, str) else body
        return json.loads(flattened(raw), object_hook=object_hook), True


def flattened(body: bytes) -> bytes:
    """``body`` with every array or object that opens at depth ``MAX_DEPTH + 1`` replaced,
    whole, by the JSON string ``TOO_DEEP``."""
    parts: list[bytes] = []
    depth = 0
    cut_from = -1
    kept_to = 0
    marker = json.dumps(TOO_DEEP).encode()
    for match in _TOKEN.finditer(body):
        token = match.group()
        if token[0] == _QUOTE:
            continue
        if token[0] in _OPENERS:
            depth += 1
            if depth == MAX_DEPTH + 1:
                cut_from = match.start()
            continue
        if depth == MAX_DEPTH + 1 and cut_from >= 0:
            parts += [body[kept_to:cut_from], marker]
            kept_to = match.end()
            cut_from = -1
        depth -= 1
    parts.append(body[kept_to:])
    return b"".join(parts)


def rejected(obj: Any, limit: int = OBJECT_LIMIT) -> bool:
    """Whether one object (an item of a list, the object of a watch event) is refused: it
    holds a part ``loads`` cut, or nests deeper than ``limit`` containers."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif item == TOO_DEEP:
            return True
    return False
