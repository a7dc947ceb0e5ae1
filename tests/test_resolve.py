"""Model sources: local files and directories, the bundled library, the Hub (fake, on 127.0.0.1), Meta's format."""

from __future__ import annotations

import json

import pytest

from kvplan.errors import ConfigError, HubError, ModelNotFoundError
from kvplan.sources.resolve import resolve_model
from tests.conftest import run_cli
from tests.conftest_hub import HubEnv, closed_port_url
from tests.factories import llama_config

GOOD_TOKEN = "hf_accepted_licence"
META_PARAMS = {"dim": 4096, "n_layers": 32, "n_heads": 32, "multiple_of": 256, "norm_eps": 1e-05, "vocab_size": -1}


def test_local_config_file_and_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(llama_config()))
    by_file = resolve_model(str(tmp_path / "config.json")).model
    by_dir = resolve_model(str(tmp_path)).model
    assert by_file.num_layers == by_dir.num_layers == 32


def test_local_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="holds no config.json"):
        resolve_model(str(tmp_path))


def test_malformed_local_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 4096,')
    with pytest.raises(ConfigError, match=r"config\.json.*not valid JSON"):
        resolve_model(str(tmp_path / "config.json"))


@pytest.mark.parametrize(
    "name", ["meta-llama/Llama-2-7b-hf", "llama-2-7b-hf", "META-LLAMA/LLAMA-2-7B-HF", "Llama-2-7b-hf"]
)
def test_library_names_case_insensitive_with_or_without_org(name):
    assert resolve_model(name, offline=True).model.name == "meta-llama/Llama-2-7b-hf"


def test_library_did_you_mean():
    with pytest.raises(ModelNotFoundError, match=r"did you mean .*Llama-2-7b-hf"):
        resolve_model("llama-2-7b-hff", offline=True)


def test_meta_params_json_matches_hf_layout(tmp_path):
    # Meta's params.json for Llama-2-7B: FFN width derived as 256 * cdiv(int(2 * 4 * 4096 / 3), 256) = 11008,
    # vocab -1 -> 32000: the same model as the HF config, so the same parameter count and KV bytes.
    (tmp_path / "params.json").write_text(json.dumps(META_PARAMS))
    meta = resolve_model(str(tmp_path)).model
    hf = resolve_model("meta-llama/Llama-2-7b-hf", offline=True).model
    assert meta.num_params == hf.num_params == 6_738_415_616
    assert meta.intermediate_size == 11008
    assert meta.layers == hf.layers


def test_design_card_name_works_offline():
    # meta-llama/Llama-2-7b holds only params.json on the Hub; offline the library's alias serves it.
    assert resolve_model("meta-llama/Llama-2-7b", offline=True).model.num_layers == 32


# --- the Hub path, through huggingface_hub against the fake Hub ---------------------------------------------------


def test_public_repo_from_hub(hub_env: HubEnv):
    hub_env.hub.add_repo("org/tiny", {"config.json": llama_config(num_hidden_layers=4)})
    resolved = resolve_model("org/tiny")
    assert resolved.model.num_layers == 4
    assert resolved.model.source.startswith("hub: org/tiny@main")


def test_meta_format_repo_from_hub(hub_env: HubEnv):
    hub_env.hub.add_repo("meta/raw", {"params.json": META_PARAMS})
    assert resolve_model("meta/raw").model.intermediate_size == 11008


def test_gated_repo_needs_token(hub_env: HubEnv):
    hub_env.hub.add_repo("org/gated", {"config.json": llama_config()}, gated_token=GOOD_TOKEN)
    with pytest.raises(HubError) as caught:
        resolve_model("org/gated")
    assert caught.value.reason == "gated"
    assert "HF_TOKEN" in str(caught.value)
    assert resolve_model("org/gated", token=GOOD_TOKEN).model.num_layers == 32


def test_gated_repo_in_library_falls_back_with_notice(hub_env: HubEnv):
    hub_env.hub.add_repo("meta-llama/Llama-3.1-8B-Instruct", {"config.json": llama_config()}, gated_token=GOOD_TOKEN)
    resolved = resolve_model("meta-llama/Llama-3.1-8B-Instruct", refresh=True)
    assert resolved.model.source.startswith("bundled library")
    assert "bundled library" in resolved.notices[0] and "gated" in resolved.notices[0]


def test_missing_repo(hub_env: HubEnv):
    with pytest.raises(HubError) as caught:
        resolve_model("org/nothing-here")
    assert caught.value.reason == "not_found"


def test_missing_config(hub_env: HubEnv):
    hub_env.hub.add_repo("org/no-config", {"README.md": b"hi"})
    with pytest.raises(HubError) as caught:
        resolve_model("org/no-config")
    assert caught.value.reason == "no_config"


def test_server_down_falls_back_to_library(hub_env: HubEnv):
    hub_env.set_endpoint(closed_port_url())
    resolved = resolve_model("meta-llama/Llama-2-7b", refresh=True)
    assert resolved.model.source.startswith("bundled library")
    assert "cannot reach the Hub" in resolved.notices[0]


def test_bundled_model_needs_no_network_online(hub_env: HubEnv):
    # Online, a library model is answered from the bundled copy: not one request reaches the (fake) Hub.
    resolved = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    assert resolved.model.source.startswith("bundled library") and resolved.notices == ()
    assert hub_env.hub.requests == []


def test_hf_cache_answers_without_network(hub_env: HubEnv, tmp_path, monkeypatch):
    # huggingface_hub's layout: models--ORG--NAME/refs/main names the commit whose snapshot holds config.json.
    cache = tmp_path / "hub-cache"
    snap = cache / "models--org--cached" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(llama_config(num_hidden_layers=3)))
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    resolved = resolve_model("org/cached")
    assert resolved.model.num_layers == 3 and resolved.model.name == "org/cached"
    assert resolved.model.source.startswith("HF cache:")
    assert hub_env.hub.requests == []


@pytest.mark.parametrize(
    "setup, repo, message",
    [
        ("gated", "org/gated", "is gated on the Hugging Face Hub"),
        ("missing", "org/missing", "not found on the Hub"),
        ("no_config", "org/no-config", "has no config.json"),
        ("down", "org/any", "cannot reach the Hub"),
    ],
)
def test_cli_hub_errors_are_one_line_with_exit_2(hub_env: HubEnv, runner, setup, repo, message):
    if setup == "gated":
        hub_env.hub.add_repo(repo, {"config.json": llama_config()}, gated_token=GOOD_TOKEN)
    elif setup == "no_config":
        hub_env.hub.add_repo(repo, {"README.md": b"hi"})
    elif setup == "down":
        hub_env.set_endpoint(closed_port_url())
    result = run_cli(runner, "estimate", repo, "--seq", "1024")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]
    assert result.stdout == ""
