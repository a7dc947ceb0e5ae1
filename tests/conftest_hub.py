"""Fixtures pointing huggingface_hub at a fake Hub on 127.0.0.1 with a throw-away cache: no test uses the internet."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hub_server import FakeHub

# A fake Hub answers in milliseconds; a short limit keeps a stuck request from stalling the suite.
_TEST_TIMEOUT_S = 3


@dataclass
class HubEnv:
    """The fake Hub, the cache it fills, and switches a test flips (each undone by monkeypatch)."""

    hub: FakeHub
    cache_dir: Path
    monkeypatch: pytest.MonkeyPatch

    def set_endpoint(self, url: str) -> None:
        """Point HF_ENDPOINT (and huggingface_hub's import-time copies of it) at `url`."""
        from huggingface_hub import constants

        self.monkeypatch.setenv("HF_ENDPOINT", url)
        self.monkeypatch.setattr(constants, "ENDPOINT", url)
        self.monkeypatch.setattr(
            constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
        )

    def set_offline(self) -> None:
        """HF_HUB_OFFLINE=1, as if it had been set before huggingface_hub was imported."""
        from huggingface_hub import constants

        self.monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        self.monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def closed_port_url() -> str:
    """The URL of a 127.0.0.1 port nothing listens on: connections are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def hub_server() -> Iterator[FakeHub]:
    """A running fake Hub; register repos with `hub_server.add_repo(...)`, its address is `hub_server.url`."""
    with FakeHub() as hub:
        yield hub


@pytest.fixture
def hub_env(hub_server: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubEnv:
    """Route huggingface_hub to `hub_server` with an empty cache in tmp_path, no token, online.

    huggingface_hub copies HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE and the timeouts into
    `huggingface_hub.constants` when it is first imported, and some of its defaults are bound then. Another test
    (or kvplan itself) may have imported it already in this process, so setting the environment alone would leave
    a stale endpoint (requests to huggingface.co) or the developer's real cache and token in play. We set both the
    environment (for kvplan.sources.hub, which reads HF_ENDPOINT and HF_HUB_OFFLINE at call time, and for
    subprocesses) and the constants (for everything huggingface_hub reads from them at call time: cache dir,
    token file, timeouts).
    """
    return route_to(hub_server, tmp_path, monkeypatch)


def route_to(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubEnv:
    """What hub_env does, for a test that needs a fresh fake Hub per example (hypothesis)."""
    from huggingface_hub import constants

    hf_home = tmp_path / "hf_home"
    cache_dir = hf_home / "hub"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", str(_TEST_TIMEOUT_S))
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", str(_TEST_TIMEOUT_S))
    for name, value in {
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(cache_dir),
        "HF_TOKEN_PATH": str(hf_home / "token"),
        "HF_STORED_TOKENS_PATH": str(hf_home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(hf_home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_ETAG_TIMEOUT": _TEST_TIMEOUT_S,
        "HF_HUB_DOWNLOAD_TIMEOUT": _TEST_TIMEOUT_S,
    }.items():
        monkeypatch.setattr(constants, name, value, raising=False)
    env = HubEnv(hub=hub, cache_dir=cache_dir, monkeypatch=monkeypatch)
    env.set_endpoint(hub.url)
    return env
