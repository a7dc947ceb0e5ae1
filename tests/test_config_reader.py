"""ConfigReader: typed reads whose errors name the key as the config writes it (text_config. prefix) and
the source, with class defaults for absent keys and caps on counts."""

from __future__ import annotations

import pytest

from kvplan.errors import ConfigError
from kvplan.model.config_reader import MAX_LAYERS, MAX_SIZE, ConfigReader, cap_for


def reader(raw: dict, **defaults: object) -> ConfigReader:
    return ConfigReader(raw, source="library:x.json", prefix="text_config.", defaults=defaults)


def test_require_int_names_every_alternative_and_the_source() -> None:
    with pytest.raises(ConfigError) as err:
        reader({}).require_int("hidden_size", "n_embd")
    assert str(err.value) == (
        "config key 'text_config.hidden_size / text_config.n_embd' in library:x.json: is missing; "
        "kvplan needs it to size the model"
    )


def test_opt_int_reads_the_first_key_set_then_class_defaults() -> None:
    cfg = reader({"n_embd": 768}, hidden_size=4096)
    assert cfg.opt_int("hidden_size", "n_embd") == 768  # the config's own key beats a class default
    assert cfg.opt_int("intermediate_size") is None
    assert cfg.opt_int("hidden_size") == 4096 and cfg.defaulted == ["hidden_size"]
    # An explicit null is set: Mistral's "sliding_window": null is no window, not the class's 4096.
    assert reader({"sliding_window": None}, sliding_window=4096).opt_int("sliding_window") is None


@pytest.mark.parametrize("value", [4096.5, "4096", True, float("nan")])
def test_only_whole_numbers_are_integers(value: object) -> None:
    with pytest.raises(ConfigError, match="'text_config.hidden_size' .*must be an integer"):
        reader({"hidden_size": value}).require_int("hidden_size")


def test_a_whole_float_is_an_integer_and_minimum_and_caps_apply() -> None:
    assert reader({"hidden_size": 4096.0}).require_int("hidden_size") == 4096
    with pytest.raises(ConfigError, match="must be >= 1, got 0"):
        reader({"hidden_size": 0}).require_int("hidden_size")
    assert reader({"first_k_dense_replace": 0}).opt_int("first_k_dense_replace", minimum=0) == 0
    assert (cap_for("num_hidden_layers"), cap_for("hidden_size")) == (MAX_LAYERS, MAX_SIZE)
    with pytest.raises(ConfigError, match=r"implausibly large \(1025 > 1,024\)"):
        reader({"n_layer": MAX_LAYERS + 1}).require_int("num_hidden_layers", "n_layer")


def test_flags_strings_and_lists_are_typed() -> None:
    cfg = reader({"tie_word_embeddings": "yes", "layer_types": "full", "hybrid_override_pattern": 7})
    assert cfg.flag("attention_bias", False) is False and cfg.opt_bool("attention_bias") is None
    with pytest.raises(ConfigError, match="'text_config.tie_word_embeddings' .*must be true or false"):
        cfg.flag("tie_word_embeddings", True)
    with pytest.raises(ConfigError, match="'text_config.layer_types' .*must be a list, got str"):
        cfg.opt_list("layer_types")
    with pytest.raises(ConfigError, match="'text_config.hybrid_override_pattern' .*must be a string"):
        cfg.opt_str("hybrid_override_pattern")


def test_per_layer_lists_name_the_entry() -> None:
    cfg = reader({"intermediate_size": [16384, 8192, 8192], "mlp_only_layers": [0, -1]})
    assert cfg.int_or_per_layer_list("intermediate_size", 3) == [16384, 8192, 8192]
    assert reader({"intermediate_size": 8192}).int_or_per_layer_list("intermediate_size", 2) == [8192, 8192]
    with pytest.raises(ConfigError, match="'text_config.intermediate_size' .*has 3 entries for 4 layers"):
        cfg.int_or_per_layer_list("intermediate_size", 4)
    with pytest.raises(ConfigError, match=r"'text_config.mlp_only_layers\[1\]' .*must be >= 0, got -1"):
        cfg.int_list("mlp_only_layers", minimum=0)
    assert reader({}).int_list("mlp_only_layers") == []
