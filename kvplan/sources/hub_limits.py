"""Bounds on kvplan's Hub calls, enforced under huggingface_hub's own client (used by kvplan.sources.hub only).

huggingface_hub bounds each read with a timeout, not a request: a body trickling at 1 byte/s never times
out (1.7 KB would take 29 minutes), a 1 GB config.json is streamed to the cache in full, a server that
ignores `Range` sends a whole checkpoint, and a 429 with `Retry-After: 3600` sleeps an hour. While one kvplan
call runs, every client huggingface_hub makes gets two event hooks that enforce, for that call as a whole:

- a deadline: each request's timeouts are cut to the time left, and the body stops when it passes;
- a size cap per response and in total (a Content-Length beyond it is refused before any byte is read);
- a request budget (a checkpoint index naming 100,000 shards asks for no more than the budget) and at most
  `max_attempts` requests for one file (huggingface_hub retries a failed read five times, 1 s apart);
- no retries on 408, 429 and 5xx: the answer is final, so the resolver can fall back at once.

A limit reached raises HubLimitError, which is no httpx error, so huggingface_hub does not retry it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx2

_RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class HubLimitError(Exception):
    """A limit of one kvplan Hub call was reached: `kind` says which, `cause` says it in words."""

    KINDS = ("deadline", "status", "attempts", "requests", "size")

    def __init__(self, kind: str, cause: str) -> None:
        super().__init__(cause)
        self.kind = kind  # one of KINDS
        self.cause = cause


class Limits:
    """The bounds of one kvplan Hub call (all its requests, on every thread huggingface_hub starts)."""

    def __init__(self, *, deadline_s: float, max_response_bytes: int, max_total_bytes: int, max_requests: int,
                 max_attempts: int = 3) -> None:
        self.deadline_s = deadline_s
        self.max_response_bytes = max_response_bytes
        self.max_total_bytes = max_total_bytes
        self.max_requests = max_requests
        self.max_attempts = max_attempts
        self._end = time.monotonic() + deadline_s
        self._lock = threading.Lock()
        self._requests = 0
        self._total_bytes = 0
        self._attempts: Counter[tuple[str, str]] = Counter()

    def remaining_s(self) -> float:
        return self._end - time.monotonic()

    def check_deadline(self) -> None:
        if self.remaining_s() <= 0:
            raise HubLimitError("deadline", f"no complete answer within {self.deadline_s:g} s")

    def on_request(self, request: Any) -> None:
        """Request hook: count the request, refuse it past a limit, and cut its timeouts to the time left."""
        self.check_deadline()
        key = (request.method, str(request.url).split("?", 1)[0])
        with self._lock:
            self._requests += 1
            self._attempts[key] += 1
            requests, attempts = self._requests, self._attempts[key]
        if requests > self.max_requests:
            raise HubLimitError("requests", f"more than {self.max_requests:,} requests")
        if attempts > self.max_attempts:
            raise HubLimitError(
                "attempts", f"{self.max_attempts} requests for the same file failed or were redirected back"
            )
        left = self.remaining_s()
        timeouts = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {
            name: left if timeouts.get(name) is None else min(float(timeouts[name]), left)
            for name in ("connect", "read", "write", "pool")
        }

    def on_response(self, response: Any) -> None:
        """Response hook: a retried status is final; a body is refused beyond the size cap or the deadline."""
        status = response.status_code
        if status in _RETRIED_STATUSES:
            retry_after = response.headers.get("Retry-After")
            after = f", retry after {retry_after[:20]} s" if retry_after else ""
            raise HubLimitError("status", f"HTTP {status}{after}")
        if response.request.method == "HEAD":
            return
        length = _content_length(response.headers.get("Content-Length"))
        if length is not None and length > self.max_response_bytes:
            ranged = status == 200 and "range" in response.request.headers
            ignored = " (it ignored the byte range asked for)" if ranged else ""
            limit = self.max_response_bytes
            raise HubLimitError("size", f"a {length:,}-byte answer{ignored}, more than the {limit:,} bytes allowed")
        response.stream = _BoundedStream(response.stream, self)

    def count_bytes(self, n_bytes: int, response_bytes: int) -> None:
        if response_bytes > self.max_response_bytes:
            raise HubLimitError("size", f"an answer of more than the {self.max_response_bytes:,} bytes kvplan reads")
        with self._lock:
            self._total_bytes += n_bytes
            total = self._total_bytes
        if total > self.max_total_bytes:
            raise HubLimitError("size", f"more than {self.max_total_bytes:,} bytes in all")
        self.check_deadline()

    def attach(self, client: Any) -> Any:
        """The client huggingface_hub built, with these limits' hooks after its own."""
        hooks = client.event_hooks
        client.event_hooks = {
            "request": [*hooks.get("request", []), self.on_request],
            "response": [*hooks.get("response", []), self.on_response],
        }
        return client


class _BoundedStream(httpx2.SyncByteStream):
    """A response body that stops at the size cap or the deadline, whichever comes first."""

    def __init__(self, inner: Any, limits: Limits) -> None:
        self._inner = inner
        self._limits = limits

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self._inner:
            seen += len(chunk)
            self._limits.count_bytes(len(chunk), seen)
            yield chunk

    def close(self) -> None:
        self._inner.close()


def _content_length(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit() or len(value.strip()) > 30:
        return None
    return int(value.strip())


@contextmanager
def bounded_client(limits: Limits) -> Iterator[None]:
    """Within the block, every client huggingface_hub creates (retries make new ones) carries `limits`."""
    from huggingface_hub.utils import _http, set_client_factory

    # huggingface_hub exposes a setter for the factory but no getter; the caller's own factory (a proxy
    # set-up) is kept underneath ours and put back afterwards.
    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", _http.default_client_factory)
    set_client_factory(lambda: limits.attach(previous()))
    try:
        yield
    finally:
        set_client_factory(previous)
