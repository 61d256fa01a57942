"""One HTTP GET with hard bounds, for every URL whose answer a namespace user controls (the
leaders' /metrics, the download pod's /progress): the user picks the image, so the answer
may be huge, endless, slow or a redirect elsewhere.

Bounds: plain http only; one overall deadline for connect, headers and body together (a
timer closes the socket, so a server that drips a byte at a time cannot hold the caller); a
body cap; no redirects followed (any status but 200 is an error).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from urllib.parse import urlsplit

DEFAULT_DEADLINE_SECONDS = 5.0
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
CHUNK = 64 * 1024


class FetchError(OSError):
    """The answer was refused: over a bound, not 200, or not reachable."""


def fetch(
    url: str,
    *,
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> str:
    """The body of a 200 answer to GET ``url``, decoded as UTF-8 (bad bytes replaced)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise FetchError(f"only http:// URLs are read, not {parts.scheme or 'no scheme'}")
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    deadline = time.monotonic() + deadline_seconds
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=deadline_seconds)
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(deadline_seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        body = _read(conn, path, deadline, max_bytes)
        if expired.is_set():
            # The timer closed the socket: what was read is a fragment, not an answer.
            raise FetchError(f"no whole answer within {deadline_seconds:g}s")
        return body
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise FetchError(f"no whole answer within {deadline_seconds:g}s") from None
        if isinstance(exc, FetchError):
            raise
        raise FetchError(str(exc) or type(exc).__name__) from None
    finally:
        timer.cancel()
        conn.close()


def _read(conn: http.client.HTTPConnection, path: str, deadline: float, max_bytes: int) -> str:
    conn.request("GET", path, headers={"Accept": "text/plain, application/json"})
    response = conn.getresponse()
    if response.status != 200:
        # Redirects included: the operator reads only the address it chose.
        raise FetchError(f"HTTP {response.status} (only 200 is read; redirects are not followed)")
    length = response.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise FetchError(f"answer of {length} bytes is over the {max_bytes}-byte limit")
    chunks: list[bytes] = []
    total = 0
    while True:
        if time.monotonic() >= deadline:
            raise FetchError("deadline passed while reading the answer")
        chunk = response.read1(CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > max_bytes:
            raise FetchError(f"answer is over the {max_bytes}-byte limit")
        chunks.append(chunk)
    if length is not None and length.isdigit() and total != int(length):
        raise FetchError(f"answer cut short: {total} of {length} bytes")
    return b"".join(chunks).decode("utf-8", errors="replace")
