"""Hub faults against a fault-injecting server on 127.0.0.1: each ends within its deadline in one HubError line,
and a model in the bundled library falls back to the bundled copy with one notice and nothing else on stderr."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

import kvplan.sources.hub as hub
from kvplan.errors import HubError
from kvplan.sources.hub import fetch_model_files, fetch_safetensors_bytes
from kvplan.sources.local_files import MAX_CONFIG_BYTES
from kvplan.sources.resolve import resolve_model
from tests.conftest import REPO, run_cli
from tests.conftest_hub import HubEnv
from tests.deadline import deadline
from tests.hub_server import Fault, safetensors_file

pytestmark = pytest.mark.slow

LIBRARY_REPO = "meta-llama/Llama-3.1-8B-Instruct"
LIBRARY_CONFIG = json.loads((REPO / "model_configs" / "meta-llama__Llama-3.1-8B-Instruct.json").read_text())
DEADLINE_S = 1.0
# What one call may take: the deadline, plus one of huggingface_hub's 1 s sleeps before a retry it had already
# decided on, plus the time a loaded CI runner needs to start the calls.
WITHIN_S = DEADLINE_S + 1 + 2
ONE_RETRY = "3 requests for the same file failed or were redirected back"

FAULTS = {
    "500": (Fault("status", status=500), "network", "HTTP 500"),
    "429": (Fault("status", status=429), "network", "HTTP 429, retry after 3600 s"),  # no hour-long sleep
    "503 on GET": (Fault("status", status=503, methods=("GET",)), "network", "HTTP 503, retry after 3600 s"),
    "hang": (Fault("hang"), "network", "timed out"),
    "hang on GET": (Fault("hang", methods=("GET",)), "network", None),
    "slow drip": (Fault("drip", methods=("GET",), interval_s=0.2), "network", None),
    "truncated body": (Fault("truncate", methods=("GET",)), "network", None),
    "no Hub headers": (
        Fault("no_hub_headers"), "network",
        "it answers without the X-Repo-Commit/ETag headers of a Hub: a proxy or a captive portal?",
    ),
    "redirect loop": (Fault("redirect_loop"), "network", ONE_RETRY),
    "huge body": (Fault("huge"), "too_large", "a 1,073,741,824-byte answer, more than the 8,388,608 bytes allowed"),
    "huge unannounced body": (
        Fault("huge", announce_length=False), "too_large", "an answer of more than the 8,388,608 bytes kvplan reads",
    ),
}


@pytest.fixture
def faulty(hub_env: HubEnv, monkeypatch: pytest.MonkeyPatch) -> HubEnv:
    monkeypatch.setenv(hub.HUB_TIMEOUT_ENV, str(DEADLINE_S))
    hub_env.hub.add_repo(LIBRARY_REPO, {"config.json": LIBRARY_CONFIG})
    hub_env.hub.add_repo("org/private-model", {"config.json": LIBRARY_CONFIG})
    return hub_env


def expected_message(env: HubEnv, reason: str, cause: str) -> str:
    if reason == "too_large":
        return f"the Hub at {env.hub.url} sent more than kvplan reads for org/private-model ({cause}); kvplan " \
            "refused it"
    return f"cannot reach the Hub at {env.hub.url} ({cause}); set HF_HUB_OFFLINE=1 to use the cache or the " \
        "bundled library"


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_each_fault_is_one_line_within_the_deadline(faulty: HubEnv, name: str) -> None:
    fault, reason, cause = FAULTS[name]
    faulty.hub.fault = fault
    started = time.monotonic()
    with deadline(WITHIN_S + 5), pytest.raises(HubError) as caught:
        fetch_model_files("org/private-model")
    assert time.monotonic() - started < WITHIN_S
    error = caught.value
    assert error.reason == reason and "\n" not in error.message
    if cause is not None:
        assert error.message == expected_message(faulty, reason, cause)
    else:  # the deadline or the retry limit, whichever the timing reaches first
        assert error.message in (
            expected_message(faulty, reason, f"no complete answer within {DEADLINE_S:g} s"),
            expected_message(faulty, reason, ONE_RETRY),
        )


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_a_library_model_falls_back_with_one_notice(faulty: HubEnv, name: str) -> None:
    faulty.hub.fault = FAULTS[name][0]
    with deadline(WITHIN_S + 5):
        resolved = resolve_model(LIBRARY_REPO, refresh=True)  # asked for the Hub: a library model needs none
    assert resolved.model.source == "bundled library: model_configs/meta-llama__Llama-3.1-8B-Instruct.json"
    (notice,) = resolved.notices
    assert notice.endswith("; using the bundled library's copy (meta-llama__Llama-3.1-8B-Instruct.json) instead")


@pytest.mark.parametrize("name", ["slow drip", "truncated body", "429", "huge body"])
def test_the_cli_says_one_line_and_nothing_else(runner, faulty: HubEnv, name: str) -> None:
    faulty.hub.fault = FAULTS[name][0]
    with deadline(WITHIN_S + 10):
        result = run_cli(runner, "estimate", LIBRARY_REPO, "--seq", "1024", "--gpu", "H100", "--json", "--refresh")
    assert result.exit_code == 0
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Note: ")
    assert json.loads(result.stdout)["model"]["source"].startswith("bundled library:")


def test_a_huge_config_never_fills_the_cache(faulty: HubEnv) -> None:
    faulty.hub.fault = Fault("huge", announce_length=False)
    with pytest.raises(HubError):
        fetch_model_files("org/private-model")
    cached = sum(p.stat().st_size for p in faulty.cache_dir.rglob("*") if p.is_file())
    assert cached <= MAX_CONFIG_BYTES  # the 1 GiB body was cut at the cap, not written out
    assert faulty.hub.body_bytes_sent < 64 * 2**20  # and the server was made to stop soon after


def test_a_resumed_download_succeeds_in_silence(faulty: HubEnv, capfd, monkeypatch) -> None:
    # huggingface_hub resumes a truncated body with a Range request (after a 1 s pause), and used to log
    # "Trying to resume download..." on stderr even though the download then succeeded.
    monkeypatch.setenv(hub.HUB_TIMEOUT_ENV, "10")
    faulty.hub.fault = Fault("truncate", methods=("GET",), times=1)
    assert fetch_model_files("org/private-model").config == LIBRARY_CONFIG
    assert capfd.readouterr().err == ""


def test_telemetry_is_off_for_kvplans_calls(faulty: HubEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)  # as a user who never opted out
    fetch_model_files("org/private-model")
    assert not any(path.startswith("/api/") for _method, path in faulty.hub.requests)  # no agent-harness probe
    assert not any("torch/" in agent for agent in faulty.hub.user_agents)  # no library versions sent
    assert constants.HF_HUB_DISABLE_TELEMETRY is False  # the caller's setting is put back


def test_an_unusable_cache_is_one_line_and_falls_back(faulty: HubEnv, tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants

    home = tmp_path / "hf_home_is_a_file"
    home.write_text("not a directory")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    with pytest.raises(HubError) as caught:
        fetch_model_files("org/private-model")
    assert caught.value.reason == "cache"
    assert caught.value.message == (
        f"the Hugging Face cache at {home / 'hub'} cannot be used (Not a directory); set HF_HOME to a writable "
        "directory"
    )
    (notice,) = resolve_model(LIBRARY_REPO, refresh=True).notices
    assert notice.startswith("the Hugging Face cache at ")


# --- safetensors headers: bounded reads, shard counts, hostile metadata ---------------------------------------------


def test_a_server_ignoring_range_is_cut_at_the_cap(faulty: HubEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "MAX_SAFETENSORS_ANSWER_BYTES", 2**20)
    weights = safetensors_file({"w": ("BF16", [2**20])})  # 2 MiB of data behind a small header
    faulty.hub.add_repo("org/big", {"model.safetensors": weights})
    faulty.hub.fault = Fault("ignore_range")
    with pytest.raises(HubError) as caught:
        fetch_safetensors_bytes("org/big")
    assert caught.value.reason == "too_large"
    assert f"(a {len(weights):,}-byte answer (it ignored the byte range asked for), more than the 1,048,576" \
        in caught.value.message
    assert faulty.hub.body_bytes_sent < 2 * 2**20 + 2**16  # at most what the socket buffers took


def test_shard_counts_are_bounded(faulty: HubEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "MAX_SHARDS", 4)  # a request budget of 2 x 4 + 16 = 24
    shards = {f"model-{i:05d}-of-00040.safetensors": safetensors_file({f"w{i}": ("BF16", [2])}) for i in range(40)}
    index = {"weight_map": {f"w{i}": name for i, name in enumerate(shards)}}
    faulty.hub.add_repo("org/many", {"model.safetensors.index.json": index, **shards})
    with pytest.raises(HubError) as caught:
        fetch_safetensors_bytes("org/many")
    assert caught.value.reason == "too_large"
    assert caught.value.message.endswith("(more than 24 requests); kvplan refused it; kvplan reads checkpoints of up "
                                         "to 4 shards")


def header_file(header: object) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(16)


HOSTILE_HEADERS = {
    "shape of strings": {"w": {"dtype": "F16", "shape": ["x"], "data_offsets": [0, 2]}},
    "negative shape": {"w": {"dtype": "F16", "shape": [-4], "data_offsets": [0, 2]}},
    "boolean offsets": {"w": {"dtype": "F16", "shape": [1], "data_offsets": [True, 2]}},
    "string offsets": {"w": {"dtype": "F16", "shape": [1], "data_offsets": ["0", "2"]}},
    "three offsets": {"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 1, 2]}},
    "huge tensor": {"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2**62]}},
    "dtype a number": {"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 2]}},
    "dtype with a command": {"w": {"dtype": "F16\n::error::x", "shape": [1], "data_offsets": [0, 2]}},
    "tensor a list": {"w": [1, 2, 3]},
    "header a list": [1, 2, 3],
    "too many dims": {"w": {"dtype": "F16", "shape": [1] * 20, "data_offsets": [0, 2]}},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_HEADERS))
def test_hostile_safetensors_metadata_is_one_line(faulty: HubEnv, case: str) -> None:
    faulty.hub.add_repo("org/bad", {"model.safetensors": header_file(HOSTILE_HEADERS[case])})
    with pytest.raises(HubError) as caught:
        fetch_safetensors_bytes("org/bad")
    assert caught.value.reason == "bad_weights"
    assert caught.value.message.startswith("cannot read the safetensors headers of org/bad: ")


@pytest.mark.parametrize("index", [[1, 2], {"weight_map": [1, 2]}, {"weight_map": {"w": ["a", "b"]}}])
def test_a_hostile_index_is_one_line(faulty: HubEnv, index: object) -> None:
    faulty.hub.add_repo("org/bad-index", {"model.safetensors.index.json": json.dumps(index).encode()})
    with pytest.raises(HubError) as caught:
        fetch_safetensors_bytes("org/bad-index")
    assert caught.value.reason == "bad_weights"


def test_weights_from_a_hostile_hub_is_one_error_line(runner, faulty: HubEnv) -> None:
    faulty.hub.add_repo("org/tiny", {"config.json": LIBRARY_CONFIG, "model.safetensors": header_file([1])})
    result = run_cli(runner, "estimate", "org/tiny", "--seq", "1024", "--gpu", "H100", "--weights-from-hub")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("Error: cannot read the safetensors headers of org/tiny: ")
