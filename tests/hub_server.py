"""A fake Hugging Face Hub on 127.0.0.1 answering the requests huggingface_hub makes for kvplan.sources.hub.

It can also misbehave the ways a network does (`Fault`): error statuses, a hang, a body trickling one byte at a
time, a truncated body, a 200 without Hub headers (a proxy or captive portal), a redirect loop, a huge body, and
a server that ignores `Range`.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

# Bytes per element of the safetensors dtypes the tests write.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip

# GET/HEAD /{org}/{name}/resolve/{revision}/{filename}; huggingface_hub URL-quotes revision and filename.
_RESOLVE_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<filename>.+)$")
_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")


def safetensors_file(tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None) -> bytes:
    """A valid .safetensors file: 8-byte little-endian header length, JSON header, then zeroed tensor data."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        size = count * SAFETENSORS_DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header).encode()
    return struct.pack("<Q", len(header_bytes)) + header_bytes + bytes(offset)


@dataclass
class FakeRepo:
    """One model repo: the same files at every revision it lists; gated repos need `Bearer <gated_token>`."""

    files: dict[str, bytes]
    gated_token: str | None = None
    revisions: tuple[str, ...] = ("main",)

    def commit(self, repo_id: str, revision: str) -> str:
        return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


FAULT_MODES = ("status", "hang", "drip", "truncate", "no_hub_headers", "redirect_loop", "huge", "ignore_range")
CAPTIVE_PORTAL_PAGE = b"<html><body>Sign in to the guest Wi-Fi to continue</body></html>"


@dataclass(frozen=True)
class Fault:
    """How the server misbehaves, and on which requests (methods, and file names; None means every file).

    status: answer `status` (429 and 503 with Retry-After: 3600). hang: accept, never answer. drip: the body
    one byte every `interval_s`. truncate: announce the body, send half, close. no_hub_headers: a 200 HTML
    page with no X-Repo-Commit/ETag. redirect_loop: 302 back to the same URL. huge: announce (or not, with
    `announce_length=False`) `huge_bytes` and stream zeros until the client stops reading. ignore_range: the
    whole file with 200 whatever Range asks. `times`: only the first so many matching requests misbehave.
    """

    mode: str
    methods: tuple[str, ...] = ("HEAD", "GET")
    files: tuple[str, ...] | None = None
    times: int | None = None
    status: int = 500
    interval_s: float = 1.0
    huge_bytes: int = 1 << 30
    announce_length: bool = True

    def __post_init__(self) -> None:
        if self.mode not in FAULT_MODES:
            raise ValueError(f"unknown fault {self.mode!r}; one of {FAULT_MODES}")

    def applies(self, method: str, filename: str | None) -> bool:
        return method in self.methods and (self.files is None or filename in self.files)


@dataclass
class FakeHub:
    """The server and its repos. Use as a context manager; `url` is what HF_ENDPOINT should hold."""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) in arrival order
    fault: Fault | None = None
    faults_served: int = 0
    body_bytes_sent: int = 0  # bytes of file bodies written, faults included (what a client was made to read)
    user_agents: list[str] = field(default_factory=list)  # the User-Agent of each request, in arrival order
    stopping: threading.Event = field(default_factory=threading.Event)

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | dict],
        *,
        gated_token: str | None = None,
        revisions: tuple[str, ...] = ("main",),
    ) -> None:
        """Register a repo; dict values are written as JSON."""
        encoded = {name: json.dumps(body).encode() if isinstance(body, dict) else body for name, body in files.items()}
        self.repos[repo_id] = FakeRepo(encoded, gated_token, revisions)

    def __enter__(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, 0.5 s by default, at every test's teardown.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()  # hanging and dripping handlers return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so no keep-alive socket outlives the server between tests.
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
            pass

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            self._serve(send_body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._serve(send_body=True)

        def _serve(self, *, send_body: bool) -> None:
            path = urlsplit(self.path).path
            hub.requests.append((self.command, path))
            hub.user_agents.append(self.headers.get("User-Agent", ""))
            match = _RESOLVE_RE.match(path)
            fault = self._fault()
            if fault is not None and self._misbehave(fault, send_body):
                return
            if match is None:  # /api/... (huggingface_hub asks /api/agent-harnesses once per process)
                return self._error(404, None, "Not Found", send_body)
            repo_id, revision, filename = match["repo"], unquote(match["revision"]), unquote(match["filename"])
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found", send_body)
            token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip() or None
            if token is not None and not token.startswith("hf_"):
                # The real Hub answers a malformed/revoked token with this exact message, on any repo.
                return self._error(401, None, "Invalid credentials in Authorization header", send_body)
            if repo.gated_token is not None and token != repo.gated_token:
                # Anonymous: 401; a valid token whose owner has not accepted the licence: 403. Both GatedRepo.
                status = 401 if token is None else 403
                return self._error(status, "GatedRepo", f"Access to model {repo_id} is restricted.", send_body)
            commits = {repo.commit(repo_id, name): name for name in repo.revisions}
            if revision not in repo.revisions and revision not in commits:
                return self._error(404, "RevisionNotFound", "Invalid rev id", send_body)
            commit = revision if revision in commits else repo.commit(repo_id, revision)
            body = repo.files.get(filename)
            if body is None:
                return self._error(404, "EntryNotFound", "Entry not found", send_body, commit=commit)
            self._file(body, commit, send_body)

        def _misbehave(self, fault: Fault, send_body: bool) -> bool:
            """Answer as the fault says; False when the fault shapes the body of a normal answer (_file)."""
            if fault.mode == "status":
                self.send_response(fault.status)
                if fault.status in (429, 503):
                    self.send_header("Retry-After", "3600")  # an hour: kvplan must not sleep on it
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif fault.mode == "hang":
                hub.stopping.wait(60)
            elif fault.mode == "no_hub_headers":
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(CAPTIVE_PORTAL_PAGE)))
                self.end_headers()
                if send_body:
                    self.wfile.write(CAPTIVE_PORTAL_PAGE)
            elif fault.mode == "redirect_loop":
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                return False
            return True

        def _write_body(self, payload: bytes, fault: Fault | None) -> None:
            try:
                if fault is not None and fault.mode == "drip":
                    for i in range(len(payload)):
                        if hub.stopping.wait(fault.interval_s):
                            return
                        self.wfile.write(payload[i : i + 1])
                        self.wfile.flush()
                        hub.body_bytes_sent += 1
                elif fault is not None and fault.mode == "truncate":
                    self.wfile.write(payload[: len(payload) // 2])
                    hub.body_bytes_sent += len(payload) // 2
                elif fault is not None and fault.mode == "huge":
                    chunk = bytes(64 * 1024)
                    sent = 0
                    while sent < fault.huge_bytes and not hub.stopping.is_set():
                        self.wfile.write(chunk)
                        sent += len(chunk)
                        hub.body_bytes_sent += len(chunk)
                else:
                    self.wfile.write(payload)
                    hub.body_bytes_sent += len(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: what a bounded client does

        def _fault(self) -> Fault | None:
            """The fault this request meets (counted once per request, in _serve)."""
            fault = hub.fault
            if fault is None or not fault.applies(self.command, self._filename()):
                return None
            if fault.times is not None and hub.faults_served >= fault.times:
                return None
            hub.faults_served += 1
            self._met = fault
            return fault

        def _file(self, body: bytes, commit: str, send_body: bool) -> None:
            status, payload, extra = 200, body, {}
            fault = getattr(self, "_met", None)
            wanted = _RANGE_RE.match(self.headers.get("Range", ""))
            if fault is not None and fault.mode == "ignore_range":
                wanted = None
            if wanted is not None and send_body:
                # huggingface_hub reads safetensors headers with "Range: bytes=0-100000", and asks
                # "bytes=8-N" again when the JSON header is longer; the end is clamped to the file like S3 does.
                first = int(wanted[1])
                last = min(int(wanted[2]) if wanted[2] else len(body) - 1, len(body) - 1)
                status, payload = 206, body[first : last + 1]
                extra["Content-Range"] = f"bytes {first}-{last}/{len(body)}"
            self.send_response(status)
            # X-Repo-Commit and ETag are mandatory: without them hf_hub_download refuses the file (FileMetadataError).
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
            if fault is not None and fault.mode == "huge":
                if fault.announce_length:
                    self.send_header("Content-Length", str(fault.huge_bytes))
            else:
                self.send_header("Content-Length", str(len(payload)))
            self.send_header("Accept-Ranges", "bytes")
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            if send_body:
                self._write_body(payload, fault)

        def _filename(self) -> str | None:
            match = _RESOLVE_RE.match(urlsplit(self.path).path)
            return unquote(match["filename"]) if match else None

        def _error(
            self, status: int, code: str | None, message: str, send_body: bool, commit: str | None = None
        ) -> None:
            # huggingface_hub turns X-Error-Code into its exception classes (hf_raise_for_status).
            payload = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code is not None:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit is not None:  # an EntryNotFound names the commit, so the client caches the absence
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if send_body:
                self.wfile.write(payload)

    return Handler
