"""JSON from the API server, decoded so that one object nested too deep costs only itself.

The API server stores open objects (fields with ``x-kubernetes-preserve-unknown-fields``) up
to 10,000 levels deep; Python's decoder gives up near 1,000 with a RecursionError, and a
list page or a watch event that cannot be decoded would stop the informer of every tenant.
Such a body is decoded a second time with every container deeper than ``MAX_DEPTH``
replaced by the string ``TOO_DEEP``; the informer then skips the objects that hold it.
The fast path is the standard decoder: the rescan runs only for a body it refused.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable, Iterator
from json.encoder import encode_basestring_ascii
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


# One object of a list, as text: what an API server object can be (etcd keeps 1.5 MiB, and
# its JSON form may be larger), many times over. A list item past it ends the list in error.
ITEM_LIMIT = 32 * 1024 * 1024
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# The same tokens as ``_TOKEN``, over text: to find where an item too deep to decode ends.
# A lone quote is a string whose end has not arrived yet.
_TEXT_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|"', re.DOTALL)


class ListBody:
    """A list response read as a stream, one item at a time.

    ``items()`` yields each element of the top-level ``items`` array, decoded (with
    ``object_hook``) as soon as its last byte arrives, with whether a part of it was cut at
    ``MAX_DEPTH``; once it is exhausted, ``rest`` holds the body's other fields (``metadata``
    with ``continue`` and ``resourceVersion``). Only the item being read is buffered, so a page
    of 500 pods of 1.5 MiB each costs one pod's text, not the page's. ``held`` is the most
    text ever buffered at once."""

    def __init__(
        self,
        chunks: Iterable[bytes],
        object_hook: ObjectHook | None = None,
        item_limit: int = ITEM_LIMIT,
    ) -> None:
        self._chunks = iter(chunks)
        self._text = codecs.getincrementaldecoder("utf-8")()
        self._decoder = json.JSONDecoder(object_hook=object_hook)
        self._hook = object_hook
        self._limit = item_limit
        self._buffer = ""
        self._at = 0
        self._ended = False
        self.rest: dict[str, Any] = {}
        self.held = 0

    def _more(self) -> bool:
        """Append the next chunk; False at the end of the body."""
        if self._ended:
            return False
        chunk = next(self._chunks, None)
        if chunk is None:
            self._ended = True
            text = self._text.decode(b"", final=True)
        else:
            text = self._text.decode(chunk)
        self._buffer = self._buffer[self._at :] + text
        self._at = 0
        self.held = max(self.held, len(self._buffer))
        if len(self._buffer) > self._limit:
            raise ValueError(f"a list item is over {self._limit:,} characters of JSON: not read")
        return True

    def _skip_space(self) -> str:
        """The next character that is not whitespace, not consumed; "" at the end."""
        while True:
            found = _WHITESPACE.match(self._buffer, self._at)
            self._at = found.end() if found else self._at
            if self._at < len(self._buffer):
                return self._buffer[self._at]
            if not self._more():
                return ""

    def _expect(self, allowed: str) -> str:
        char = self._skip_space()
        if not char or char not in allowed:
            raise ValueError(f"list body: expected one of {allowed!r} at {char!r}")
        self._at += 1
        return char

    def _value(self) -> tuple[Any, bool]:
        """The JSON value that starts here, read whole, and whether it was cut."""
        self._skip_space()
        last = threshold = -1  # the text tried last, and the text to wait for
        while True:
            unread = len(self._buffer) - self._at
            if unread > last and (unread >= threshold or self._ended):
                try:
                    value, end = self._decoder.raw_decode(self._buffer, self._at)
                except RecursionError:
                    return self._too_deep()
                except json.JSONDecodeError:
                    if self._ended:
                        raise
                    # Tried again once the text has doubled: each item is decoded a bounded
                    # number of times, however small the chunks.
                    last, threshold = unread, 2 * unread
                else:
                    # A number is the one value whose end the next chunk may still move.
                    if end < len(self._buffer) or self._ended or not _is_number(value):
                        self._at = end
                        return value, False
                    last, threshold = unread, unread + 1
            if not self._more() and len(self._buffer) - self._at <= last:
                raise ValueError("list body: it ends inside a value")

    def _too_deep(self) -> tuple[Any, bool]:
        """An item the decoder cannot take: found whole by its brackets, decoded flattened."""
        depth = 0
        scan_from = self._at
        while True:
            for match in _TEXT_TOKEN.finditer(self._buffer, scan_from):
                token = match.group()
                if token == '"':
                    break  # a string not yet whole: read on from its start
                scan_from = match.end()
                if token[0] == '"':
                    continue
                depth += 1 if token in "[{" else -1
                if depth == 0:
                    item = self._buffer[self._at : scan_from]
                    self._at = scan_from
                    return json.loads(flattened(item.encode()), object_hook=self._hook), True
            read = self._at
            if not self._more():
                raise ValueError("list body: it ends inside a value")
            scan_from -= read  # ``_more`` drops the text before ``_at``

    def items(self) -> Iterator[tuple[Any, bool]]:
        self._expect("{")
        if self._skip_space() == "}":
            self._at += 1
            return
        while True:
            key, _ = self._value()
            self._expect(":")
            if key == "items" and self._skip_space() == "[":
                self._at += 1
                if self._skip_space() == "]":
                    self._at += 1
                else:
                    while True:
                        yield self._value()
                        if self._expect(",]") == "]":
                            break
            else:
                self.rest[str(key)] = self._value()[0]
            if self._expect(",}") == "}":
                return


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Shorter strings are measured by the encoder itself (faster than the checks below).
_LONG = 1024
# What json.dumps escapes besides every character past ASCII (ensure_ascii).
_ESCAPED = ('"', "\\", *map(chr, range(32)))


def _string_size(text: str) -> int:
    if len(text) >= _LONG and text.isascii() and not any(c in text for c in _ESCAPED):
        return len(text) + 2
    return len(encode_basestring_ascii(text))


def encoded_size(value: Any) -> int:
    """``len(json.dumps(value, separators=(",", ":"), default=str))`` without writing the
    text of long strings: the store weighs every object it keeps, and the encoder's copy of
    a few large strings was most of the cost of a list of large objects."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += _string_size(item)
        elif isinstance(item, dict):
            total += 2 * len(item) + 1 if item else 2  # braces, colons, commas
            for key, inner in item.items():
                if isinstance(key, str):
                    stack.append(key)
                else:  # what json.dumps makes of a key that is not a string
                    total += len(json.dumps({key: 0}, separators=(",", ":"))) - 4
                stack.append(inner)
        elif isinstance(item, (list, tuple)):
            total += len(item) + 1 if item else 2  # brackets, commas
            stack.extend(item)
        elif item is None or item is True:
            total += 4
        elif item is False:
            total += 5
        elif isinstance(item, int):
            total += len(int.__repr__(item))
        elif isinstance(item, float):
            total += len(json.dumps(item))
        else:
            total += len(json.dumps(str(item)))
    return total
