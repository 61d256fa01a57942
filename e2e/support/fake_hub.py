"""A small Hugging Face Hub for the download tests: the routes huggingface_hub uses to list a
repository (model info with file sizes and checksums, the file tree) and to fetch a file
(HEAD for its metadata, GET with Range to resume), served from repositories the tests make in
memory. It can be throttled so a test can kill a download midway, and it records every range
it served, so a test can see a resumed download. Nothing here comes from the real Hub."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import pathlib
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

CHUNK = 64 * 1024


class HubFile:
    """A file of a repository: bytes in memory, or a file on disk for the large ones."""

    def __init__(self, name: str, data: bytes, lfs: bool, path: str = "") -> None:
        self.name, self.lfs, self.path = name, lfs, path
        self._data = data
        self.size = os.path.getsize(path) if path else len(data)
        sha256 = hashlib.sha256()
        blob = hashlib.sha1(f"blob {self.size}\0".encode())
        for piece in self.pieces(0, self.size):
            sha256.update(piece)
            blob.update(piece)
        self.sha256, self.blob_id = sha256.hexdigest(), blob.hexdigest()

    @property
    def data(self) -> bytes:
        if self.path:
            return pathlib.Path(self.path).read_bytes()
        return self._data

    def pieces(self, start: int, end: int) -> Iterator[bytes]:
        if not self.path:
            for offset in range(start, end, CHUNK):
                yield self._data[offset : min(end, offset + CHUNK)]
            return
        with open(self.path, "rb") as handle:
            handle.seek(start)
            while start < end:
                piece = handle.read(min(16 * CHUNK, end - start))
                if not piece:
                    return
                start += len(piece)
                yield piece

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


class QuietServer(http.server.ThreadingHTTPServer):
    """A client that closes a connection it will not reuse is no error worth a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class HubRepo:
    repo: str
    commit: str
    files: dict[str, HubFile]


@dataclass
class FakeHub:
    host: str = "127.0.0.1"
    port: int = 0
    bytes_per_second: float = 0.0  # per connection (a CDN's cap); 0: as fast as it goes
    link_bytes_per_second: float = 0.0  # all connections together (a NIC); 0: no limit
    _link_free: float = 0.0  # when the shared link is next free
    repos: dict[str, HubRepo] = field(default_factory=dict)
    served: list[tuple[str, int, int]] = field(default_factory=list)  # (file, start, bytes)
    requested: list[str] = field(default_factory=list)  # every path asked for
    # Every request's (path, Authorization header or None).
    authorizations: list[tuple[str, str | None]] = field(default_factory=list)
    # A hostile Hub, per file name: bytes sent beyond the listed size; an answer that never
    # ends; a redirect of every download to another server (base URL).
    extra_bytes: dict[str, int] = field(default_factory=dict)
    endless: set[str] = field(default_factory=set)
    redirect_to: str = ""
    active: int = 0  # answers being sent
    most_active: int = 0  # the most answers sent at once
    # Rewrites the model info the listing answers (a Hub listing hostile names).
    listing: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: http.server.ThreadingHTTPServer | None = None

    def add_repo(self, repo: str, files: dict[str, bytes], lfs_suffix: str = ".safetensors") -> str:
        commit = hashlib.sha1(repo.encode() + b"".join(sorted(files.values()))).hexdigest()
        self.repos[repo] = HubRepo(
            repo,
            commit,
            {name: HubFile(name, data, name.endswith(lfs_suffix)) for name, data in files.items()},
        )
        return commit

    def add_repo_from_disk(
        self, repo: str, folder: pathlib.Path, lfs_suffix: str = ".safetensors"
    ) -> str:
        """Every file under ``folder``, served from disk (for repositories of several GB)."""
        files = {
            str(path.relative_to(folder)): HubFile(
                str(path.relative_to(folder)), b"", path.name.endswith(lfs_suffix), str(path)
            )
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }
        commit = hashlib.sha1(
            repo.encode() + "".join(f.sha256 for f in files.values()).encode()
        ).hexdigest()
        self.repos[repo] = HubRepo(repo, commit, files)
        return commit

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client_env(self, cache: pathlib.Path) -> dict[str, str]:
        """The environment for a huggingface_hub client of this Hub, caching in ``cache``."""
        return {
            **os.environ,
            "HF_ENDPOINT": self.url,
            "HF_HUB_CACHE": str(cache),
            "HF_HOME": str(cache.parent / "home"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }

    def ranges(self, name: str) -> list[tuple[int, int]]:
        with self.lock:
            return [(start, size) for file, start, size in self.served if file == name]

    def start(self) -> FakeHub:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, body=False)

            def do_GET(self) -> None:
                hub.handle(self, body=True)

        self._server = QuietServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # --- routes ---------------------------------------------------------------------------

    def _repo(self, name: str, revision: str) -> HubRepo | None:
        repo = self.repos.get(name)
        if repo is None or revision not in ("main", repo.commit):
            return None
        return repo

    def handle(self, request: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(request.path).path)
        with self.lock:
            self.requested.append(path)
            self.authorizations.append((path, request.headers.get("Authorization")))
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if info and (repo := self._repo(info.group(1), info.group(2))):
            listed = self._model_info(repo)
            self._json(request, self.listing(listed) if self.listing else listed, body)
        elif tree and (repo := self._repo(tree.group(1), tree.group(2))):
            self._json(request, self._tree(repo), body)
        elif resolve and (repo := self._repo(resolve.group(1), resolve.group(2))):
            hub_file = repo.files.get(resolve.group(3))
            if hub_file is None:
                self._error(request, 404, "EntryNotFound")
            elif self.redirect_to:
                request.send_response(302)
                request.send_header("Location", self.redirect_to + request.path)
                request.send_header("Content-Length", "0")
                request.end_headers()
            else:
                self._file(request, repo, hub_file, body)
        else:
            self._error(request, 404, "RepositoryNotFound")

    @staticmethod
    def _model_info(repo: HubRepo) -> dict[str, Any]:
        return {
            "id": repo.repo,
            "modelId": repo.repo,
            "sha": repo.commit,
            "siblings": [
                {
                    "rfilename": f.name,
                    "size": f.size,
                    "blobId": f.blob_id,
                    **(
                        {"lfs": {"size": f.size, "sha256": f.sha256, "pointerSize": 134}}
                        if f.lfs
                        else {}
                    ),
                }
                for f in repo.files.values()
            ],
        }

    @staticmethod
    def _tree(repo: HubRepo) -> list[dict[str, Any]]:
        return [
            {
                "type": "file",
                "path": f.name,
                "size": f.size,
                "oid": f.blob_id,
                **({"lfs": {"size": f.size, "oid": f.sha256, "pointerSize": 134}} if f.lfs else {}),
            }
            for f in repo.files.values()
        ]

    @staticmethod
    def _json(request: http.server.BaseHTTPRequestHandler, payload: Any, body: bool) -> None:
        data = json.dumps(payload).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if body:
            request.wfile.write(data)

    @staticmethod
    def _error(request: http.server.BaseHTTPRequestHandler, status: int, code: str) -> None:
        data = json.dumps({"error": code}).encode()
        request.send_response(status)
        request.send_header("X-Error-Code", code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _take_link(self, amount: int) -> None:
        """Waits for the shared link to carry ``amount`` bytes, in turn with the others."""
        if not self.link_bytes_per_second:
            return
        with self.lock:
            now = time.monotonic()
            until = max(now, self._link_free) + amount / self.link_bytes_per_second
            self._link_free = until
        if until > now:
            time.sleep(until - now)

    @staticmethod
    def _send(
        request: http.server.BaseHTTPRequestHandler, f: HubFile, start: int, end: int
    ) -> Iterator[int]:
        """Sends [start, end) in pieces, yielding each one's size: from disk with sendfile
        (no copy through Python, so the server takes little of the CPU a benchmark measures)."""
        if not f.path:
            for piece in f.pieces(start, end):
                request.wfile.write(piece)
                yield len(piece)
            return
        sock = request.connection
        with open(f.path, "rb") as handle:
            while start < end:
                n = os.sendfile(sock.fileno(), handle.fileno(), start, min(1 << 20, end - start))
                if not n:
                    return
                start += n
                yield n

    def _file(
        self, request: http.server.BaseHTTPRequestHandler, repo: HubRepo, f: HubFile, body: bool
    ) -> None:
        size = f.size
        start, end = 0, size
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range") or "")
        if wanted:
            start = min(int(wanted.group(1)), size)
            end = min(size, int(wanted.group(2)) + 1) if wanted.group(2) else size
        extra = self.extra_bytes.get(f.name, 0)
        if extra:
            # A lying server: the whole file and more, whatever was asked.
            start, end, wanted = 0, size, None
        request.send_response(206 if wanted else 200)
        request.send_header("X-Repo-Commit", repo.commit)
        request.send_header("ETag", f'"{f.etag}"')
        if f.lfs:
            request.send_header("X-Linked-Etag", f'"{f.etag}"')
            request.send_header("X-Linked-Size", str(size))
        request.send_header("Accept-Ranges", "bytes")
        if wanted:
            request.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        endless = f.name in self.endless
        request.send_header("Content-Length", str(end - start + extra))
        request.end_headers()
        if not body:
            return
        sent = 0
        began = time.monotonic()
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if endless:
                # A byte a second: an answer that, for all practical purposes, never ends.
                for offset in range(start, end):
                    request.wfile.write(f.data[offset : offset + 1])
                    sent += 1
                    time.sleep(1)
            for piece in self._send(request, f, start, end):
                sent += piece
                self._take_link(piece)
                if self.bytes_per_second:
                    # Per connection, like a CDN's cap on one stream.
                    ahead = sent / self.bytes_per_second - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
            if extra:
                request.wfile.write(b"\0" * extra)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self.lock:
                self.served.append((f.name, start, sent))
                self.active -= 1
