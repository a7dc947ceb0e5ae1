"""kvplan.sources.hub through huggingface_hub's real client, against the fake Hub of tests/hub_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvplan.errors import ConfigError, HubError
from kvplan.sources.hub import (
    HubFiles,
    SafetensorsBytes,
    fetch_model_files,
    fetch_safetensors_bytes,
)
from kvplan.sources.repo_ids import looks_like_repo_id
from tests.conftest_hub import HubEnv, closed_port_url
from tests.hub_server import safetensors_file

GOOD_TOKEN = "hf_accepted_licence"
LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
META_PARAMS = {"dim": 4096, "n_layers": 32, "n_heads": 32, "multiple_of": 256, "norm_eps": 1e-05, "vocab_size": -1}


def hub_error(call, *args, **kwargs) -> HubError:
    with pytest.raises(HubError) as caught:
        call(*args, **kwargs)
    return caught.value


# --- config.json -------------------------------------------------------------------------------------------------


def test_public_repo_returns_its_config(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/public", {"config.json": LLAMA_CONFIG})
    files = fetch_model_files("org/public")
    assert files == HubFiles(
        repo_id="org/public",
        revision="main",
        config=LLAMA_CONFIG,
        params=None,
        hf_quant_config=None,
        config_filename="config.json",
        from_cache=False,
    )
    # Fetched into the huggingface_hub cache that HF_HUB_CACHE names (models--org--public/snapshots/<commit>/).
    assert list(hub_env.cache_dir.glob("models--org--public/snapshots/*/config.json"))


def test_companion_hf_quant_config_is_read(hub_env: HubEnv) -> None:
    quant = {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    hub_env.hub.add_repo("nvidia/fp8", {"config.json": LLAMA_CONFIG, "hf_quant_config.json": quant})
    assert fetch_model_files("nvidia/fp8").hf_quant_config == quant


def test_infinity_in_config_is_accepted(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/inf", {"config.json": b'{"hidden_size": 8, "max_position_embeddings": Infinity}'})
    assert fetch_model_files("org/inf").config == {"hidden_size": 8, "max_position_embeddings": float("inf")}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            b'{"hidden_size": 8,',
            "is not valid JSON (Expecting property name enclosed in double quotes at line 1, column 19)",
        ),
        (b"[1, 2]", "must hold a JSON object, not a list"),
        (b"\xff\xfe{}", "is not UTF-8 text (byte 0 is 0xff)"),
    ],
)
def test_malformed_config_is_a_config_error_naming_the_file(hub_env: HubEnv, body: bytes, problem: str) -> None:
    hub_env.hub.add_repo("org/broken", {"config.json": body})
    with pytest.raises(ConfigError) as caught:
        fetch_model_files("org/broken")
    assert str(caught.value) == f"config key 'config.json' in org/broken at revision main: {problem}"


def test_gated_repo_without_token_says_how_to_get_access(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("meta-llama/Gated", {"config.json": LLAMA_CONFIG}, gated_token=GOOD_TOKEN)
    error = hub_error(fetch_model_files, "meta-llama/Gated")
    assert error.reason == "gated"
    assert str(error) == (
        f"meta-llama/Gated is gated on the Hugging Face Hub: accept its licence on {hub_env.hub.url}/meta-llama/Gated"
        " and pass --token or set HF_TOKEN"
    )
    assert error.exit_code == 2


def test_gated_repo_with_a_token_lacking_access_is_gated(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("meta-llama/Gated", {"config.json": LLAMA_CONFIG}, gated_token=GOOD_TOKEN)
    # The server answers 403 GatedRepo: a well-formed token whose owner has not accepted the licence.
    assert hub_error(fetch_model_files, "meta-llama/Gated", token="hf_someone_else").reason == "gated"


def test_gated_repo_with_token_argument(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("meta-llama/Gated", {"config.json": LLAMA_CONFIG}, gated_token=GOOD_TOKEN)
    assert fetch_model_files("meta-llama/Gated", token=GOOD_TOKEN).config == LLAMA_CONFIG


def test_gated_repo_with_hf_token_environment(hub_env: HubEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    hub_env.hub.add_repo("meta-llama/Gated", {"config.json": LLAMA_CONFIG}, gated_token=GOOD_TOKEN)
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert fetch_model_files("meta-llama/Gated").config == LLAMA_CONFIG


def test_token_argument_overrides_hf_token(hub_env: HubEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    hub_env.hub.add_repo("meta-llama/Gated", {"config.json": LLAMA_CONFIG}, gated_token=GOOD_TOKEN)
    monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
    assert fetch_model_files("meta-llama/Gated", token=GOOD_TOKEN).config == LLAMA_CONFIG
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert hub_error(fetch_model_files, "meta-llama/Gated", token="hf_someone_else").reason == "gated"


def test_rejected_token_is_an_auth_error(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/public", {"config.json": LLAMA_CONFIG})
    # The Hub answers 401 "Invalid credentials in Authorization header" for a token it does not know at all.
    error = hub_error(fetch_model_files, "org/public", token="not-a-token")
    assert error.reason == "auth"
    assert str(error) == f"the Hub at {hub_env.hub.url} rejected the token: check --token or HF_TOKEN"


def test_missing_repo(hub_env: HubEnv) -> None:
    error = hub_error(fetch_model_files, "org/does-not-exist")
    assert error.reason == "not_found"
    assert str(error) == (
        "org/does-not-exist not found on the Hub (check the spelling, or pass --token for a private repo)"
    )


def test_repo_without_config_json(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/no-config", {"README.md": b"# weights only"})
    error = hub_error(fetch_model_files, "org/no-config")
    assert error.reason == "no_config"
    assert str(error) == "org/no-config has no config.json (nor Meta's params.json) at revision main"


def test_meta_format_repo_gives_params(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("meta-llama/Llama-2-7b", {"params.json": META_PARAMS, "consolidated.00.pth": b"\0"})
    files = fetch_model_files("meta-llama/Llama-2-7b")
    assert (files.config, files.params, files.config_filename) == (None, META_PARAMS, "params.json")


def test_revision(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/public", {"config.json": LLAMA_CONFIG}, revisions=("main", "v1.0"))
    assert fetch_model_files("org/public", revision="v1.0").revision == "v1.0"
    assert ("HEAD", "/org/public/resolve/v1.0/config.json") in hub_env.hub.requests
    error = hub_error(fetch_model_files, "org/public", revision="v2.0")
    assert error.reason == "revision"
    assert str(error) == "org/public has no revision 'v2.0' on the Hub (check --revision)"


def test_server_down_is_a_network_error_quickly(hub_env: HubEnv) -> None:
    down_url = closed_port_url()
    hub_env.set_endpoint(down_url)
    started = time.monotonic()
    error = hub_error(fetch_model_files, "org/public")
    # huggingface_hub alone would retry with back-off for ~23 s; kvplan's single HEAD fails at once.
    assert time.monotonic() - started < 5
    assert error.reason == "network"
    assert str(error).startswith(f"cannot reach the Hub at {down_url} (")
    assert str(error).endswith("); set HF_HUB_OFFLINE=1 to use the cache or the bundled library")


def test_server_down_falls_back_to_the_cache(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/public", {"config.json": LLAMA_CONFIG})
    fetch_model_files("org/public")
    hub_env.set_endpoint(closed_port_url())
    files = fetch_model_files("org/public")
    assert (files.config, files.from_cache) == (LLAMA_CONFIG, True)


@pytest.mark.parametrize(
    ("repo_files", "field"), [({"config.json": LLAMA_CONFIG}, "config"), ({"params.json": META_PARAMS}, "params")]
)
def test_offline_reads_what_an_online_run_cached(hub_env: HubEnv, repo_files: dict, field: str) -> None:
    hub_env.hub.add_repo("org/model", repo_files)
    online = fetch_model_files("org/model")
    hub_env.set_offline()
    requests_before = len(hub_env.hub.requests)
    offline = fetch_model_files("org/model")
    assert getattr(offline, field) == getattr(online, field) == next(iter(repo_files.values()))
    assert offline.from_cache
    assert len(hub_env.hub.requests) == requests_before  # offline means no request at all


def test_offline_without_cache(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/public", {"config.json": LLAMA_CONFIG})
    hub_env.set_offline()
    error = hub_error(fetch_model_files, "org/public")
    assert error.reason == "offline"
    assert str(error) == (
        "org/public (revision main) is not in the local cache and kvplan is offline"
        " (--offline or HF_HUB_OFFLINE); run once online to cache its config"
    )
    assert hub_env.hub.requests == []


def test_offline_flag_never_touches_the_network(hub_env: HubEnv) -> None:
    # HF_HUB_OFFLINE is unset (hub_env is online), but kvplan's --offline asks for the cache only.
    hub_env.hub.add_repo("org/public", {"config.json": LLAMA_CONFIG})
    assert hub_error(fetch_model_files, "org/public", offline=True).reason == "offline"
    assert hub_env.hub.requests == []


def test_offline_remembers_a_repo_without_config(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/no-config", {"README.md": b"# weights only"})
    assert hub_error(fetch_model_files, "org/no-config").reason == "no_config"
    hub_env.set_offline()
    # The online 404s carried X-Repo-Commit, so huggingface_hub cached the absence of both files.
    assert hub_error(fetch_model_files, "org/no-config").reason == "no_config"


# --- safetensors headers -----------------------------------------------------------------------------------------


def test_safetensors_bytes_single_file(hub_env: HubEnv) -> None:
    tensors = {
        "model.embed_tokens.weight": ("BF16", [8, 4]),
        "model.norm.weight": ("F32", [4]),
        "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", [4, 4]),
        "model.layers.0.self_attn.q_proj.weight_scale": ("F32", []),
    }
    hub_env.hub.add_repo("org/single", {"config.json": LLAMA_CONFIG, "model.safetensors": safetensors_file(tensors)})
    # BF16: 8*4 = 32 params * 2 B = 64 B; F32: 4 params * 4 B + 1 scalar * 4 B = 20 B; F8_E4M3: 4*4 = 16 params
    # * 1 B = 16 B. Total 64 + 20 + 16 = 100 B over 32 + 4 + 16 + 1 = 53 params.
    assert fetch_safetensors_bytes("org/single") == SafetensorsBytes(
        total_bytes=100, by_dtype=(("BF16", 64), ("F32", 20), ("F8_E4M3", 16)), num_params=53, files=1
    )


def test_safetensors_bytes_sharded(hub_env: HubEnv) -> None:
    shard_1 = {"embed.weight": ("F16", [3, 5]), "lm_head.weight": ("F16", [5, 3])}
    shard_2 = {"layer.0.weight": ("BF16", [7]), "layer.0.zeros": ("I8", [2, 3])}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {
        "metadata": {"total_size": 80},
        "weight_map": {**dict.fromkeys(shard_1, names[0]), **dict.fromkeys(shard_2, names[1])},
    }
    hub_env.hub.add_repo(
        "org/sharded",
        {
            "config.json": LLAMA_CONFIG,
            "model.safetensors.index.json": index,
            names[0]: safetensors_file(shard_1),
            # A JSON header over 100,000 bytes makes huggingface_hub ask for the rest with a second ranged GET.
            names[1]: safetensors_file(shard_2, metadata={"format": "pt", "note": "x" * 120_000}),
        },
    )
    # F16: (3*5 + 5*3) = 30 params * 2 B = 60 B; BF16: 7 * 2 B = 14 B; I8: 2*3 = 6 params * 1 B = 6 B.
    # Total 60 + 14 + 6 = 80 B (the index's total_size) over 30 + 7 + 6 = 43 params in 2 files.
    assert fetch_safetensors_bytes("org/sharded") == SafetensorsBytes(
        total_bytes=80, by_dtype=(("BF16", 14), ("F16", 60), ("I8", 6)), num_params=43, files=2
    )
    ranged_gets = [path for method, path in hub_env.hub.requests if method == "GET" and path.endswith(names[1])]
    assert len(ranged_gets) == 2


def test_safetensors_errors(hub_env: HubEnv) -> None:
    hub_env.hub.add_repo("org/bin-only", {"config.json": LLAMA_CONFIG, "pytorch_model.bin": b"\0"})
    hub_env.hub.add_repo("org/gated", {"model.safetensors": safetensors_file({})}, gated_token=GOOD_TOKEN)
    error = hub_error(fetch_safetensors_bytes, "org/bin-only")
    assert (error.reason, str(error)) == (
        "no_weights",
        "org/bin-only has no model.safetensors nor model.safetensors.index.json at revision main;"
        " give the weight size with --weights-bytes",
    )
    # get_safetensors_metadata reports a missing repo as "not a safetensors repo": kvplan tells them apart.
    assert hub_error(fetch_safetensors_bytes, "org/missing").reason == "not_found"
    assert hub_error(fetch_safetensors_bytes, "org/bin-only", revision="nope").reason == "revision"
    assert hub_error(fetch_safetensors_bytes, "org/gated").reason == "gated"
    assert fetch_safetensors_bytes("org/gated", token=GOOD_TOKEN).total_bytes == 0
    hub_env.set_endpoint(closed_port_url())
    assert hub_error(fetch_safetensors_bytes, "org/bin-only").reason == "network"
    hub_env.set_offline()
    assert hub_error(fetch_safetensors_bytes, "org/bin-only").reason == "offline"


def test_index_naming_a_missing_shard(hub_env: HubEnv) -> None:
    index = {"weight_map": {"w": "model-00001-of-00001.safetensors"}}
    hub_env.hub.add_repo("org/lost-shard", {"model.safetensors.index.json": index})
    error = hub_error(fetch_safetensors_bytes, "org/lost-shard")
    assert (error.reason, str(error)) == (
        "bad_weights",
        "org/lost-shard lists model-00001-of-00001.safetensors in model.safetensors.index.json, but the Hub has no"
        " such file at revision main; give the weight size with --weights-bytes",
    )


@pytest.mark.parametrize(
    "tensor",
    [
        {"dtype": "F16", "shape": [2]},  # no data_offsets: huggingface_hub's SafetensorsParsingError
        {"dtype": "F16", "shape": [2], "data_offsets": [4, 0]},  # an end before the start: kvplan's own check
    ],
)
def test_unparsable_safetensors_header(hub_env: HubEnv, tensor: dict) -> None:
    header = json.dumps({"w": tensor}).encode()
    hub_env.hub.add_repo("org/bad", {"model.safetensors": len(header).to_bytes(8, "little") + header + bytes(4)})
    error = hub_error(fetch_safetensors_bytes, "org/bad")
    assert error.reason == "bad_weights"
    assert str(error).startswith("cannot read the safetensors headers of org/bad: ")


# --- repo ids and imports ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("meta-llama/Llama-2-7b", True),
        ("Qwen/Qwen2.5-7B-Instruct", True),
        ("deepseek-ai/DeepSeek-V3", True),
        ("llama-2-7b", False),  # no org: a library name
        ("a/b/c", False),
        ("org/na--me", False),  # the Hub forbids "--" and ".."
        ("org/..", False),
        ("org/name-", False),
        ("models/config.json", False),  # a mistyped path, not a repo
        ("/abs/path", False),
    ],
)
def test_looks_like_repo_id(text: str, expected: bool) -> None:
    assert looks_like_repo_id(text) is expected


def test_existing_local_path_is_not_a_repo_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert looks_like_repo_id("org/model") is False
    assert looks_like_repo_id("org/other") is True


def test_importing_kvplan_hub_does_not_import_huggingface_hub() -> None:
    code = "import sys, kvplan.sources.hub; print('huggingface_hub' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "False"
