"""Fills the model cache: run by the download Job in the serving image (which has
huggingface_hub, as vLLM needs it), never by the operator.

Usage: python3 download.py '<request json>'
Request: {"repos": [{"repo": ..., "revision": ...}], "mode": "fill" | "verify" | "collect",
          "progressPort": int, "connections": int, "chunkBytes": int,
          "minBytesPerSecond": int, "deadlineSeconds": int,
          "keep": [{"repo": ..., "commit": ...}]   (collect only)}

fill: asks the Hub (huggingface_hub's listing) for each repository's files with their sizes
and checksums, refuses names that are not what the Hub's format allows, checks that the volume
has room, then fetches every missing byte in chunks over several connections at once, across
files too. Each file is written in place into HF_HUB_CACHE's blobs under a partial name, with
a chunk map beside it, so a killed pod's successor fetches only the chunks that are missing.
The checksums (sha256 for LFS files, the git blob id for the rest) are computed from the bytes
as they arrive, in order; what arrives ahead of its turn is held in memory up to a bound and
otherwise read back once its turn comes, so a file is verified moments after its last chunk.
It lays out the snapshot and the revision's ref (the Hub's cache layout, which vLLM reads
offline) and leaves a marker, so a later Job for the same snapshot checks sizes only.
verify: only checks a volume somebody else filled.
collect: deletes what only revisions no longer asked for use.

While it runs, GET :progressPort/progress answers {phase, bytesDone, bytesTotal, ...}.
At the end the report goes to /dev/termination-log (the operator reads it from the pod).
Exit 0: done; 1: failed, a new pod may succeed (it resumes); 3: failed for a reason another
try cannot change (the listing is unusable, the volume is too small).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.server
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

TERMINATION_LOG = "/dev/termination-log"
MARKERS = ".kimik3-verified"
HASH_CHUNK = 16 * 1024 * 1024
READ_SIZE = 1024 * 1024
CONNECTIONS = 32
CHUNK_BYTES = 16 * 1024 * 1024
# Below this a connection counts as stalled; the overall deadline is derived from it too.
MIN_BYTES_PER_SECOND = 20_000_000
READ_TIMEOUT = 30.0
CHUNK_ATTEMPTS = 6
MAX_REDIRECTS = 5
# Chunks that arrive ahead of their file's hashing are kept in memory up to this much.
AHEAD_BYTES = 1024 * 1024 * 1024
SAVE_SECONDS = 0.5
STEAL_MIN_BYTES = 4 * 1024 * 1024
EXIT_RETRY = 1
EXIT_FINAL = 3
HEX40 = re.compile(r"[0-9a-f]{40}")
HEX64 = re.compile(r"[0-9a-f]{64}")


class FinalError(Exception):
    """A failure no retry can change: the Job stops at once."""

    reason = "DownloadRefused"


class TooSmallError(FinalError):
    reason = "VolumeTooSmall"


class DeadlineError(Exception):
    pass


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int
    sha256: str  # empty when the file is not in LFS
    blob_id: str

    @property
    def blob(self) -> str:
        """The file's name in the cache's blobs/ directory."""
        return self.sha256 or self.blob_id


@dataclass
class Plan:
    repo: str
    revision: str
    commit: str
    files: list[RepoFile]


# --- the Hub's listing, checked -------------------------------------------------------------


def checked_name(repo: str, name: Any) -> str:
    """A file name the Hub listed: relative, with no way out of the snapshot directory."""
    parts = name.split("/") if isinstance(name, str) else []
    if (
        not parts
        or any(p in ("", ".", "..") for p in parts)
        or "\\" in name
        or "\0" in name
        or len(name) > 1024
    ):
        raise FinalError(f"{repo}: the Hub listed a file named {str(name)[:200]!r}")
    return str(name)


def checked_hex(repo: str, what: str, value: Any, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise FinalError(
            f"{repo}: the Hub listed {what} {str(value)[:100]!r}, not {pattern.pattern}"
        )
    return value


def plan_of(repo: str, revision: str, commit: Any, siblings: list[Any]) -> Plan:
    files = []
    for s in siblings:
        name = checked_name(repo, s.rfilename)
        size = s.size
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise FinalError(f"{repo}/{name}: the Hub listed the size {str(size)[:40]!r}")
        sha256 = ""
        if s.lfs:
            sha256 = checked_hex(repo, f"the sha256 of {name}", s.lfs.get("sha256"), HEX64)
        blob_id = checked_hex(repo, f"the blob id of {name}", s.blob_id, HEX40)
        files.append(RepoFile(name, size, sha256, blob_id))
    return Plan(repo, revision, checked_hex(repo, "the commit", commit, HEX40), files)


def resolve(api: Any, repo: str, revision: str) -> Plan:
    info = api.model_info(repo, revision=revision, files_metadata=True)
    return plan_of(repo, revision, info.sha, list(info.siblings or []))


def repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


# --- the chunk map --------------------------------------------------------------------------


class ChunkMap:
    """Which chunks of a partial file are on disk: <blob>.chunks beside <blob>.incomplete,
    rewritten (atomically) after each chunk, so a successor fetches only the rest."""

    def __init__(self, partial: str, size: int, chunk: int) -> None:
        self.path = partial + ".chunks"
        self.size, self.chunk = size, chunk
        self.count = max(1, -(-size // chunk))
        self.done = bytearray(self.count)
        self.lock = threading.Lock()
        self.saved = 0.0
        try:
            with open(self.path) as handle:
                saved = json.load(handle)
            if saved.get("size") == size and saved.get("chunk") == chunk:
                for index in saved.get("done", []):
                    if isinstance(index, int) and 0 <= index < self.count:
                        self.done[index] = 1
        except (OSError, ValueError, AttributeError):
            pass

    def bounds(self, index: int) -> tuple[int, int]:
        start = index * self.chunk
        return start, min(self.size, start + self.chunk)

    def missing(self) -> list[int]:
        return [i for i in range(self.count) if not self.done[i]]

    def covers(self, offset: int) -> bool:
        return offset < self.size and bool(self.done[offset // self.chunk])

    def done_bytes(self) -> int:
        return sum(b - a for a, b in map(self.bounds, self.done_indices()))

    def done_indices(self) -> list[int]:
        return [i for i in range(self.count) if self.done[i]]

    def mark(self, index: int) -> None:
        """Recorded on disk at most every SAVE_SECONDS: a kill loses at most that much of
        the map, and the chunks it no longer lists are fetched again, never taken as done."""
        with self.lock:
            self.done[index] = 1
            if time.monotonic() - self.saved >= SAVE_SECONDS:
                self.save()

    def save(self) -> None:
        self.saved = time.monotonic()
        text = json.dumps({"size": self.size, "chunk": self.chunk, "done": self.done_indices()})
        with open(self.path + ".tmp", "w") as handle:
            handle.write(text)
        os.replace(self.path + ".tmp", self.path)


# --- checksums from the bytes as they arrive ------------------------------------------------


class AheadBudget:
    """Bytes held in memory for hashing later, across all files."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self.lock = threading.Lock()

    def take(self, amount: int) -> bool:
        with self.lock:
            if self.used + amount > self.limit:
                return False
            self.used += amount
            return True

    def give(self, amount: int) -> None:
        with self.lock:
            self.used -= amount


class StreamDigest:
    """One file's checksum, fed in order. Pieces that arrive early wait in memory (within
    the budget) or, beyond it, are read back from the file once the chunk is on disk."""

    def __init__(self, f: RepoFile, path: str, chunks: ChunkMap, budget: AheadBudget) -> None:
        self.file, self.path, self.chunks, self.budget = f, path, chunks, budget
        self.digest = hashlib.sha256() if f.sha256 else hashlib.sha1(f"blob {f.size}\0".encode())
        self.at = 0
        self.ahead: dict[int, bytes] = {}
        self.cond = threading.Condition()
        self.failed = False

    def offer(self, offset: int, data: bytes) -> None:
        with self.cond:
            if offset >= self.at and offset not in self.ahead and self.budget.take(len(data)):
                self.ahead[offset] = data
                self.cond.notify()

    def chunk_done(self) -> None:
        with self.cond:
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify()

    def run(self, progress: Progress) -> str:
        """Hashes to the end of the file; returns the hex digest ("" if stopped)."""
        size = self.file.size
        with open(self.path, "rb") as handle:
            while self.at < size:
                with self.cond:
                    while (
                        not self.failed
                        and self.at not in self.ahead
                        and not self.chunks.covers(self.at)
                    ):
                        self.cond.wait(1.0)
                    if self.failed:
                        self._drop_ahead()
                        return ""
                    piece = self.ahead.pop(self.at, None)
                if piece is not None:
                    self.budget.give(len(piece))
                else:
                    _, end = self.chunks.bounds(self.at // self.chunks.chunk)
                    handle.seek(self.at)
                    piece = handle.read(min(HASH_CHUNK, end - self.at))
                    if not piece:
                        raise OSError(f"{self.path}: shorter than its chunk map says")
                self.digest.update(piece)
                with self.cond:
                    self.at += len(piece)
                    # Pieces already hashed from the file are not needed any more.
                    for offset in [o for o in self.ahead if o < self.at]:
                        self.budget.give(len(self.ahead.pop(offset)))
                progress.add_verified(len(piece))
        return self.digest.hexdigest()

    def _drop_ahead(self) -> None:
        for data in self.ahead.values():
            self.budget.give(len(data))
        self.ahead.clear()


# --- HTTP -----------------------------------------------------------------------------------


def origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname or "", port


class Connections:
    """One keep-alive connection per origin, for one thread."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str, int], http.client.HTTPConnection] = {}

    def get(self, url: str) -> http.client.HTTPConnection:
        key = origin(url)
        conn = self.open.get(key)
        if conn is None:
            scheme, host, port = key
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(host, port, timeout=READ_TIMEOUT)
            self.open[key] = conn
        return conn

    def drop(self, url: str) -> None:
        conn = self.open.pop(origin(url), None)
        if conn is not None:
            conn.close()


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


# --- the download ---------------------------------------------------------------------------


@dataclass
class Target:
    """One file to fetch, into its blob."""

    repo: str
    file: RepoFile
    url: str
    blob: str
    chunks: ChunkMap
    digest: StreamDigest | None = None
    location: str = ""  # where the Hub's URL redirected to, reused by every chunk
    lock: threading.Lock = field(default_factory=threading.Lock)
    pieces_left: dict[int, int] = field(default_factory=dict)  # chunk -> pieces in flight
    left: int = 0
    error: str = ""

    @property
    def partial(self) -> str:
        return self.blob + ".incomplete"


@dataclass
class Progress:
    phase: str = "Resolving"
    bytes_total: int = 0
    verified_bytes: int = 0
    files_total: int = 0
    message: str = ""
    started: float = field(default_factory=time.time)
    present: int = 0  # bytes on disk before this run: whole blobs and finished chunks
    fetched: int = 0  # bytes written by this run
    retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_verified(self, amount: int) -> None:
        with self.lock:
            self.verified_bytes += amount

    def add_retry(self, what: str) -> None:
        with self.lock:
            self.retries += 1
        print(f"retrying {what}", file=sys.stderr, flush=True)

    def add_fetched(self, amount: int) -> None:
        with self.lock:
            self.fetched += amount

    def bytes_done(self) -> int:
        return min(self.bytes_total, self.present + self.fetched)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            phase = self.phase
            if phase == "Downloading":
                done = self.bytes_done()
            else:
                done = self.bytes_total if phase in ("Verifying", "Ready") else 0
            return {
                "phase": phase,
                "bytesDone": done,
                "bytesTotal": self.bytes_total,
                "verifiedBytes": self.verified_bytes,
                "filesTotal": self.files_total,
                "elapsedSeconds": round(time.time() - self.started, 1),
                "message": self.message,
            }


@dataclass(frozen=True)
class Settings:
    endpoint: str
    headers: dict[str, str]
    connections: int = CONNECTIONS
    chunk_bytes: int = CHUNK_BYTES
    min_rate: int = MIN_BYTES_PER_SECOND
    deadline: float = float("inf")  # time.monotonic() at which the whole download gives up
    # Off only for the benchmark's comparison of a download with and without them.
    checksums: bool = True


def headers_for(url: str, settings: Settings) -> dict[str, str]:
    """The token goes to the Hub's own origin only, never to where it redirects."""
    if origin(url) == origin(settings.endpoint):
        return dict(settings.headers)
    return {k: v for k, v in settings.headers.items() if k.lower() != "authorization"}


def fetch_range(
    span: Span,
    pool: Connections,
    settings: Settings,
    write: Callable[[int, bytes], None],
) -> None:
    """The bytes of ``span``: follows redirects, stops at the listed size, and moves
    ``span.at`` on as it writes (less far when the connection broke)."""
    target = span.target
    start, end = span.at, span.end
    name = f"{target.repo}/{target.file.name}"
    url = target.location or target.url
    if time.monotonic() > settings.deadline:
        raise DeadlineError()
    for _ in range(MAX_REDIRECTS + 1):
        conn = pool.get(url)
        headers = headers_for(url, settings)
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers["Accept-Encoding"] = "identity"
        try:
            conn.request("GET", path_of(url), headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException):
            pool.drop(url)
            raise
        if response.status in (301, 302, 303, 307, 308):
            location = response.getheader("Location") or ""
            response.read(64 * 1024)
            response.close()
            if not location:
                raise OSError(f"{name}: a redirect without a Location")
            url = urljoin(url, location)
            continue
        if response.status in (401, 403, 404, 410) and target.location:
            # A signed CDN address has expired: ask the Hub again.
            response.close()
            pool.drop(url)
            with target.lock:
                target.location = ""
            raise OSError(f"{name}: {response.status} from the redirected address")
        if response.status not in (200, 206):
            response.close()
            pool.drop(url)
            raise OSError(f"{name}: HTTP {response.status}")
        if url != target.url:
            with target.lock:
                target.location = url
        _read_body(span, response, end, pool, url, settings, write)
        return
    raise OSError(f"{name}: more than {MAX_REDIRECTS} redirects")


def _read_body(
    span: Span,
    response: http.client.HTTPResponse,
    asked_end: int,
    pool: Connections,
    url: str,
    settings: Settings,
    write: Callable[[int, bytes], None],
) -> None:
    """Reads the answer for [span.at, asked_end) into the file, up to span.end, which an
    idle connection may pull in meanwhile (the rest of this answer is then not read)."""
    target = span.target
    start = span.at
    name = f"{target.repo}/{target.file.name}"
    size = target.file.size
    body_end = size  # where the answer's bytes end in the file
    if response.status == 206:
        found = re.fullmatch(
            r"bytes (\d+)-(\d+)/(\d+|\*)", response.getheader("Content-Range") or ""
        )
        if not found or int(found.group(1)) != start:
            pool.drop(url)
            raise OSError(f"{name}: asked for bytes {start}-{asked_end - 1}, the answer has none")
        if found.group(3) != "*" and int(found.group(3)) != size:
            pool.drop(url)
            raise FinalError(
                f"{name}: the server's copy has {found.group(3)} bytes, the Hub listed {size}"
            )
        body_end = int(found.group(2)) + 1
    elif start != 0:
        pool.drop(url)
        raise OSError(f"{name}: the server ignored the range request")
    length = response.getheader("Content-Length")
    if response.status == 200 and length is not None and int(length) > size:
        pool.drop(url)
        raise FinalError(f"{name}: the server answered {length} bytes, the Hub listed {size}")
    # Slower than the minimum rate, after a grace period, is a stall: another try.
    limit = time.monotonic() + 30 + (asked_end - start) / settings.min_rate
    try:
        while span.at < span.end:
            now = time.monotonic()
            if now > settings.deadline:
                raise DeadlineError()
            if now > limit:
                raise TimeoutError(
                    f"{name}: bytes {span.at}-{span.end - 1} slower than the minimum"
                )
            # At most one read from the socket (a trickle returns, and the clocks are
            # checked), and never past the span's end, wherever it is now.
            piece = response.read1(min(READ_SIZE, span.end - span.at))
            if not piece:
                break
            write(span.at, piece)
            span.at += len(piece)
        if span.at < span.end:
            pool.drop(url)
        elif body_end > span.end:
            # More follows than is still wanted (the span was cut, or a whole-file answer).
            pool.drop(url)
        elif response.read(1):
            pool.drop(url)
            raise FinalError(f"{name}: the server sent more than the {size} bytes the Hub listed")
    except (OSError, http.client.HTTPException):
        pool.drop(url)
        if span.at == start:
            raise
    finally:
        response.close()


@dataclass
class Span:
    """Bytes [at, end) of chunk ``index`` still to fetch. Near the end of the download an idle
    connection takes the back half of the largest span in flight (steal), so the last
    chunks are not one capped connection's pace each."""

    target: Target
    index: int
    at: int
    end: int


def work_items(targets: list[Target]) -> list[Span]:
    """One span per missing chunk, in file order."""
    spans = []
    for target in targets:
        for index in target.chunks.missing():
            start, end = target.chunks.bounds(index)
            target.pieces_left[index] = 1
            spans.append(Span(target, index, start, end))
    return spans


def steal(candidates: list[Span]) -> Span | None:
    """The back half of the span in flight with the most left, where that is worth a request.
    The cut stays READ_SIZE past where its owner is, and the owner never reads past its
    span's end, so no byte is fetched twice."""
    if not candidates:
        return None
    largest = max(candidates, key=lambda sp: sp.end - sp.at)
    left = largest.end - largest.at - READ_SIZE
    if left < STEAL_MIN_BYTES:
        return None
    cut = largest.end - left // 2
    taken = Span(largest.target, largest.index, cut, largest.end)
    with largest.target.lock:
        largest.target.pieces_left[largest.index] += 1
    largest.end = cut
    return taken


class Downloader:
    def __init__(self, settings: Settings, progress: Progress) -> None:
        self.settings = settings
        self.progress = progress
        self.budget = AheadBudget(AHEAD_BYTES)
        self.local = threading.local()
        self.failure: BaseException | None = None
        self.lock = threading.Lock()

    def pool(self) -> Connections:
        found: Connections | None = getattr(self.local, "pool", None)
        if found is None:
            found = self.local.pool = Connections()
        return found

    def chunk(self, span: Span) -> None:
        """The bytes of ``span``, whose end another connection may pull in meanwhile."""
        if self.failure is not None:
            return
        target, index = span.target, span.index
        fd = os.open(target.partial, os.O_WRONLY)
        digest = target.digest

        def write(offset: int, data: bytes) -> None:
            os.pwrite(fd, data, offset)
            self.progress.add_fetched(len(data))
            if digest is not None:
                digest.offer(offset, data)

        try:
            attempt = 0
            while span.at < span.end:
                error: BaseException | None = None
                try:
                    fetch_range(span, self.pool(), self.settings, write)
                except (OSError, http.client.HTTPException) as exc:
                    error = exc
                if self.failure is not None:
                    return
                if span.at < span.end:
                    # A broken answer keeps what it wrote; the next try asks for the rest.
                    attempt += 1
                    self.progress.add_retry(f"{target.repo}/{target.file.name}: {error}")
                    if attempt >= CHUNK_ATTEMPTS:
                        raise OSError(
                            f"{target.repo}/{target.file.name}: bytes {span.at}-{span.end - 1} "
                            f"not fetched in {CHUNK_ATTEMPTS} tries: "
                            f"{error or 'the answers ended early'}"
                        )
                    time.sleep(min(8.0, 0.5 * 2**attempt))
            with target.lock:
                target.pieces_left[index] -= 1
                whole = target.pieces_left[index] == 0
            if whole:
                target.chunks.mark(index)
                if digest is not None:
                    digest.chunk_done()
        except BaseException as exc:
            with self.lock:
                self.failure = self.failure or exc
            raise
        finally:
            os.close(fd)

    def hash(self, target: Target) -> None:
        digest = target.digest
        if digest is None:
            return
        try:
            actual = digest.run(self.progress)
        except BaseException as exc:
            with self.lock:
                self.failure = self.failure or exc
            raise
        expected = target.file.blob
        if actual and actual != expected:
            kind = "sha256" if target.file.sha256 else "git blob"
            target.error = (
                f"{target.repo}/{target.file.name}: {kind} {actual[:12]}, the Hub says "
                f"{expected[:12]}"
            )

    def run(self, targets: list[Target]) -> list[str]:
        """Fetches every missing chunk; returns what failed verification."""
        for target in targets:
            if os.path.getsize(target.partial) != target.file.size:
                with open(target.partial, "r+b") as handle:
                    handle.truncate(target.file.size)
            if self.settings.checksums:
                target.digest = StreamDigest(
                    target.file, target.partial, target.chunks, self.budget
                )
        work = iter(work_items(targets))
        taking = threading.Lock()
        in_flight: dict[int, Span] = {}

        def fetcher() -> None:
            while self.failure is None:
                with taking:
                    item = next(work, None) or steal(list(in_flight.values()))
                    if item is None:
                        return
                    in_flight[id(item)] = item
                try:
                    self.chunk(item)
                except BaseException:
                    for target in targets:
                        if target.digest is not None:
                            target.digest.stop()
                    return
                finally:
                    with taking:
                        in_flight.pop(id(item), None)

        hash_workers = max(1, min(len(targets), self.settings.connections + 2))
        with ThreadPoolExecutor(max_workers=hash_workers) as hashers:
            hashed = [hashers.submit(self.hash, t) for t in targets]
            threads = [
                threading.Thread(target=fetcher, daemon=True)
                for _ in range(self.settings.connections)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for future in hashed:
                with contextlib.suppress(BaseException):
                    future.result()
        if self.failure is not None:
            raise self.failure
        problems = []
        for target in targets:
            if target.error:
                problems.append(target.error)
                # A wrong file is fetched whole again by the next try.
                for path in (target.partial, target.chunks.path):
                    with_suppressed(os.remove, path)
            else:
                os.replace(target.partial, target.blob)
                with_suppressed(os.remove, target.chunks.path)
        return problems


def with_suppressed(call: Callable[[str], Any], path: str) -> None:
    with contextlib.suppress(OSError):
        call(path)


# --- the cache layout -----------------------------------------------------------------------


def link_snapshot(cache_dir: str, plan: Plan) -> str:
    """snapshots/<commit>/<file> -> ../../blobs/<blob>, and refs/<revision>: huggingface_hub's
    layout, which vLLM resolves with HF_HUB_OFFLINE=1."""
    base = os.path.join(cache_dir, repo_folder(plan.repo))
    snapshot = os.path.join(base, "snapshots", plan.commit)
    for f in plan.files:
        path = os.path.join(snapshot, f.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        relative = os.path.relpath(os.path.join(base, "blobs", f.blob), os.path.dirname(path))
        if os.path.islink(path) and os.readlink(path) == relative:
            continue
        with_suppressed(os.remove, path)
        os.symlink(relative, path)
    if plan.revision != plan.commit:
        refs = os.path.join(base, "refs", plan.revision)
        os.makedirs(os.path.dirname(refs), exist_ok=True)
        with open(refs + ".tmp", "w") as handle:
            handle.write(plan.commit)
        os.replace(refs + ".tmp", refs)
    return snapshot


def marker_path(cache_dir: str, plan: Plan) -> str:
    return os.path.join(cache_dir, MARKERS, repo_folder(plan.repo), plan.commit + ".json")


def already_verified(cache_dir: str, plan: Plan, snapshot: str) -> bool:
    try:
        with open(marker_path(cache_dir, plan)) as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        return False
    paths = [(os.path.join(snapshot, f.name), f.size) for f in plan.files]
    return recorded == {f.name: f.size for f in plan.files} and all(
        os.path.exists(path) and os.path.getsize(path) == size for path, size in paths
    )


def file_digest(path: str, f: RepoFile, progress: Progress) -> str:
    digest = hashlib.sha256() if f.sha256 else hashlib.sha1(f"blob {f.size}\0".encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            progress.add_verified(len(chunk))
    return digest.hexdigest()


def verify(
    plan: Plan,
    snapshot: str,
    progress: Progress,
    checked: set[str],
    sizes_only: bool = False,
    workers: int = 4,
) -> list[str]:
    """Every file present, of the Hub's size and checksum (the blobs in ``checked`` were
    hashed while they arrived); returns what is wrong."""

    def check(f: RepoFile) -> str:
        path = os.path.join(snapshot, f.name)
        if not os.path.exists(path):
            return f"{plan.repo}/{f.name}: missing"
        size = os.path.getsize(path)
        if size != f.size:
            return f"{plan.repo}/{f.name}: {size} bytes, the Hub says {f.size}"
        if sizes_only or f.blob in checked:
            return ""
        actual = file_digest(path, f, progress)
        if actual != f.blob:
            kind = "sha256" if f.sha256 else "git blob"
            return f"{plan.repo}/{f.name}: {kind} {actual[:12]}, the Hub says {f.blob[:12]}"
        return ""

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [problem for problem in pool.map(check, plan.files) if problem]


# --- room on the volume, and collection -----------------------------------------------------


def human(amount: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


def room_check(cache_dir: str, needed: int) -> None:
    """Refuses before the first byte when the rest cannot fit beside what the volume holds
    (the revisions still serving stay until the rollout completes)."""
    stats = os.statvfs(cache_dir)
    free = stats.f_bavail * stats.f_frsize
    if needed <= free:
        return
    capacity = stats.f_blocks * stats.f_frsize
    used = capacity - stats.f_bfree * stats.f_frsize
    at_least = used + needed
    raise TooSmallError(
        f"the model cache volume is too small: this download needs {human(needed)} more and "
        f"{human(free)} is free ({human(used)} used of {human(capacity)}, including revisions "
        f"still in use until the rollout completes); it needs at least {human(at_least)} "
        f"({-(-at_least // 2**30)}Gi): give spec.model.cache.size or the claim that much"
    )


def allocated(path: str) -> int:
    try:
        return os.lstat(path).st_blocks * 512
    except OSError:
        return 0


def tree_bytes(path: str) -> int:
    total = allocated(path)
    for root, dirs, files in os.walk(path):
        total += sum(allocated(os.path.join(root, n)) for n in dirs + files)
    return total


def snapshot_blobs(snapshot: str) -> set[str]:
    found = set()
    for root, _, files in os.walk(snapshot):
        for n in files:
            path = os.path.join(root, n)
            if os.path.islink(path):
                found.add(os.path.basename(os.readlink(path)))
    return found


def held(cache_dir: str, keep: dict[str, set[str]]) -> list[tuple[str, str, int]]:
    """(folder or file, what it is, bytes) for everything in the cache that only revisions
    outside ``keep`` (repo folder -> commits) use."""
    found: list[tuple[str, str, int]] = []
    if not os.path.isdir(cache_dir):
        return found
    for folder in sorted(os.listdir(cache_dir)):
        base = os.path.join(cache_dir, folder)
        if not folder.startswith("models--") or os.path.islink(base) or not os.path.isdir(base):
            continue
        repo = folder[len("models--") :].replace("--", "/")
        commits = keep.get(folder)
        if commits is None:
            found.append((base, f"{repo} (every revision)", tree_bytes(base)))
            continue
        snapshots = os.path.join(base, "snapshots")
        names = sorted(os.listdir(snapshots)) if os.path.isdir(snapshots) else []
        wanted: set[str] = set()
        for commit in names:
            path = os.path.join(snapshots, commit)
            if commit in commits:
                wanted |= snapshot_blobs(path)
            else:
                found.append((path, f"{repo}@{commit[:12]}", tree_bytes(path)))
        blobs = os.path.join(base, "blobs")
        for blob in sorted(os.listdir(blobs)) if os.path.isdir(blobs) else []:
            if blob.split(".")[0] not in wanted:
                path = os.path.join(blobs, blob)
                found.append((path, "", allocated(path)))
        refs = os.path.join(base, "refs")
        for root, _, files in os.walk(refs):
            for n in files:
                path = os.path.join(root, n)
                try:
                    with open(path) as handle:
                        points = handle.read().strip()
                except OSError:
                    continue
                if points not in commits:
                    found.append((path, "", 0))
    return found


def old_revisions(cache_dir: str, plans: list[Plan]) -> tuple[list[str], int]:
    keep: dict[str, set[str]] = {}
    for plan in plans:
        keep.setdefault(repo_folder(plan.repo), set()).add(plan.commit)
    found = held(cache_dir, keep)
    return [what for _, what, _ in found if what], sum(size for _, _, size in found)


def collect(cache_dir: str, keep_list: list[dict[str, Any]]) -> dict[str, Any]:
    keep: dict[str, set[str]] = {}
    for entry in keep_list:
        repo = str(entry["repo"])
        commit = checked_hex(repo, "the commit to keep", entry["commit"], HEX40)
        keep.setdefault(repo_folder(repo), set()).add(commit)
    freed, removed = 0, []
    for path, what, size in held(cache_dir, keep):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            with_suppressed(os.remove, path)
        freed += size
        if what:
            removed.append(what)
            if what.endswith("(every revision)"):
                shutil.rmtree(
                    os.path.join(cache_dir, MARKERS, os.path.basename(path)), ignore_errors=True
                )
            folder, _, commit = path.rpartition("/snapshots/")
            if commit:
                repo_markers = os.path.join(
                    cache_dir, MARKERS, os.path.basename(folder), commit + ".json"
                )
                with_suppressed(os.remove, repo_markers)
    return {"phase": "Collected", "bytesFreed": freed, "removed": removed}


# --- the Job --------------------------------------------------------------------------------


def serve_progress(progress: Progress, port: int) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(progress.snapshot()).encode()
            self.send_response(200 if self.path.startswith("/progress") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def report(payload: dict[str, Any]) -> None:
    text = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    print(text, flush=True)
    try:
        with open(TERMINATION_LOG, "w") as handle:
            handle.write(text[:4000])
    except OSError:
        pass


def targets_of(
    plans: list[Plan], cache_dir: str, settings: Settings, progress: Progress
) -> Iterator[Target]:
    from huggingface_hub import hf_hub_url

    seen: set[str] = set()
    for plan in plans:
        blobs = os.path.join(cache_dir, repo_folder(plan.repo), "blobs")
        os.makedirs(blobs, exist_ok=True)
        for f in plan.files:
            blob = os.path.join(blobs, f.blob)
            if blob in seen:
                continue
            seen.add(blob)
            if os.path.exists(blob) and os.path.getsize(blob) == f.size:
                progress.present += f.size
                continue
            partial = blob + ".incomplete"
            chunks = ChunkMap(partial, f.size, settings.chunk_bytes)
            if not os.path.exists(partial):
                # The map first: a partial file without one is taken for an old prefix.
                chunks.save()
                open(partial, "wb").close()
            elif not os.path.exists(chunks.path):
                # A partial file from a download before chunk maps: a prefix on disk.
                have = min(os.path.getsize(partial), f.size)
                for index in range(have // settings.chunk_bytes):
                    chunks.done[index] = 1
            url = hf_hub_url(plan.repo, f.name, revision=plan.commit)
            progress.present += chunks.done_bytes()
            yield Target(plan.repo, f, url, blob, chunks)


def settings_of(request: dict[str, Any]) -> Settings:
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers

    deadline = float(request.get("deadlineSeconds") or 0)
    return Settings(
        endpoint=constants.ENDPOINT,
        headers=build_hf_headers(),
        connections=max(1, int(request.get("connections") or CONNECTIONS)),
        chunk_bytes=max(1 << 20, int(request.get("chunkBytes") or CHUNK_BYTES)),
        min_rate=max(1, int(request.get("minBytesPerSecond") or MIN_BYTES_PER_SECOND)),
        deadline=time.monotonic() + deadline if deadline > 0 else float("inf"),
        checksums=request.get("checksums", True) is not False,
    )


def fill(request: dict[str, Any], progress: Progress) -> dict[str, Any]:
    from huggingface_hub import HfApi

    cache_dir = os.environ["HF_HUB_CACHE"]
    mode = request.get("mode") or ("verify" if request.get("verifyOnly") else "fill")
    if mode == "collect":
        return collect(cache_dir, list(request.get("keep") or []))
    settings = settings_of(request)
    api = HfApi()
    plans = [resolve(api, r["repo"], r["revision"]) for r in request["repos"]]
    with progress.lock:
        progress.bytes_total = sum(f.size for p in plans for f in p.files)
        progress.files_total = sum(len(p.files) for p in plans)
    checked: set[str] = set()
    fetch_seconds = 0.0
    if mode == "fill":
        os.makedirs(cache_dir, exist_ok=True)
        targets = list(targets_of(plans, cache_dir, settings, progress))
        room_check(cache_dir, sum(t.file.size - t.chunks.done_bytes() for t in targets))
        with progress.lock:
            progress.phase = "Downloading"
        started = time.monotonic()
        problems = Downloader(settings, progress).run(targets)
        if problems:
            return {"phase": "Failed", "problems": problems[:10]}
        fetch_seconds = time.monotonic() - started
        progress.message = (
            f"fetched {sum(t.file.size for t in targets)} bytes in {fetch_seconds:.1f}s over "
            f"{settings.connections} connections"
        )
        checked = {t.file.blob for t in targets}
    with progress.lock:
        progress.phase = "Verifying"
    problems = []
    for plan in plans:
        snapshot = os.path.join(cache_dir, repo_folder(plan.repo), "snapshots", plan.commit)
        if mode == "fill":
            snapshot = link_snapshot(cache_dir, plan)
        if already_verified(cache_dir, plan, snapshot):
            progress.add_verified(sum(f.size for f in plan.files))
            continue
        found = verify(plan, snapshot, progress, checked, sizes_only=not settings.checksums)
        problems += found
        if not found and mode == "fill":
            path = marker_path(cache_dir, plan)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                json.dump({f.name: f.size for f in plan.files}, handle)
    repos = [
        {
            "repo": p.repo,
            "revision": p.revision,
            "commit": p.commit,
            "files": len(p.files),
            "bytes": sum(f.size for f in p.files),
        }
        for p in plans
    ]
    if problems:
        return {"phase": "Failed", "repos": repos, "problems": problems[:10]}
    with progress.lock:
        progress.phase = "Ready"
    result: dict[str, Any] = {"phase": "Ready", "repos": repos, "bytesTotal": progress.bytes_total}
    result["seconds"] = round(time.time() - progress.started, 2)
    if mode == "fill":
        result["fetchSeconds"] = round(fetch_seconds, 2)
        result["retries"] = progress.retries
        old, old_bytes = old_revisions(cache_dir, plans)
        if old_bytes:
            result.update({"oldRevisions": old[:20], "oldBytes": old_bytes})
    return result


def watchdog(seconds: float) -> None:
    """Whatever hangs, the pod ends at its deadline with a report, not silently."""

    def expire() -> None:
        message = f"the download did not finish within its deadline of {seconds:.0f}s"
        timer.cancel()
        report({"phase": "Failed", "final": True, "problems": [message]})
        os._exit(EXIT_FINAL)

    # A little after the script's own deadline, which says what was slow.
    timer = threading.Timer(seconds + 30, expire)
    timer.daemon = True
    timer.start()


def main(argv: list[str]) -> int:
    request = json.loads(argv[1])
    progress = Progress()
    if float(request.get("deadlineSeconds") or 0) > 0:
        watchdog(float(request["deadlineSeconds"]))
    if request.get("mode") != "collect":
        serve_progress(progress, int(request.get("progressPort", 8090)))
    code = EXIT_RETRY
    try:
        result = fill(request, progress)
    except FinalError as exc:
        result = {
            "phase": "Failed",
            "final": True,
            "reason": exc.reason,
            "problems": [str(exc)[:600]],
        }
        code = EXIT_FINAL
    except DeadlineError:
        seconds = request.get("deadlineSeconds")
        result = {
            "phase": "Failed",
            "final": True,
            "problems": [f"the download did not finish within its deadline of {seconds}s"],
        }
        code = EXIT_FINAL
    except Exception as exc:
        result = {"phase": "Failed", "problems": [f"{type(exc).__name__}: {exc}"[:600]]}
    report(result)
    return 0 if result["phase"] in ("Ready", "Collected") else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
