"""Typed reads from one config dict, each error naming the key (with its `text_config.` prefix) and the source.

A config.json lists only what differs from its class's defaults, so a reader carries the Transformers class
defaults for the keys a config omits (Gemma 3 omits vocab_size) and records which ones it had to use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvplan.errors import ConfigError

# Caps far above any real model, so a corrupt or hostile file fails at once instead of planning for minutes:
# the largest bundled models have 126 layers (Llama-3.1-405B), 512 experts (Qwen3-Next) and 256 heads
# (Nemotron-H's Mamba heads). Every per-layer loop is bounded by MAX_LAYERS, so the largest accepted config
# plans in a bounded number of steps (tests/test_model_caps.py counts them).
MAX_LAYERS = 1024
MAX_EXPERTS = 4096
MAX_HEADS = 1024
# Widths, vocabularies and lengths only enter products, never loops: 2**48 rejects nonsense, not models.
MAX_SIZE = 1 << 48

_CAPS: dict[str, int] = {
    **dict.fromkeys(
        "num_hidden_layers n_layer num_layers n_layers depth num_kv_shared_layers altup_num_inputs "
        "num_nextn_predict_layers mtp_num_hidden_layers".split(),
        MAX_LAYERS,
    ),
    **dict.fromkeys(
        "num_local_experts num_experts n_routed_experts n_shared_experts num_experts_per_tok".split(), MAX_EXPERTS
    ),
    **dict.fromkeys(
        "num_attention_heads n_head num_heads n_heads num_key_value_heads num_kv_heads n_head_kv "
        "multi_query_group_num linear_num_key_heads linear_num_value_heads mamba_num_heads mamba_n_heads".split(),
        MAX_HEADS,
    ),
}


def cap_for(name: str) -> int:
    """The largest value kvplan accepts for key `name`: num_hidden_layers -> 1,024; hidden_size -> 2**48."""
    return _CAPS.get(name, MAX_SIZE)


class ConfigReader:
    """Typed reads over one config dict (the top level, text_config or vision_config)."""

    def __init__(self, raw: Mapping[str, Any], *, source: str, prefix: str = "",
                 defaults: Mapping[str, Any] | None = None) -> None:
        self.raw = raw
        self.source = source
        self.prefix = prefix  # "text_config." for a nested text model: errors name the key as written
        self.defaults = dict(defaults or {})
        self.defaulted: list[str] = []  # class defaults used, in order of use

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def error(self, name: str, problem: str) -> ConfigError:
        """A ConfigError naming `name` under this reader's prefix and source."""
        return ConfigError(self.key(name), problem, self.source)

    def sets(self, name: str) -> bool:
        """Whether the config itself states `name` (an explicit null included), class defaults aside."""
        return name in self.raw

    def has(self, name: str) -> bool:
        """Whether `name` has a non-null value, from the config or from the class defaults."""
        return self.raw_value(name)[1] is not None

    def raw_value(self, *names: str) -> tuple[str, Any]:
        """The first of `names` the config sets, else the first with a class default, else (names[0], None).

        An explicit null counts as set: Mistral v0.3's "sliding_window": null means no window, not "use the
        class default of 4096".
        """
        for name in names:
            if name in self.raw:
                return name, self.raw[name]
        for name in names:
            if self.defaults.get(name) is not None:
                self.defaulted.append(name)
                return name, self.defaults[name]
        return names[0], None

    def require_int(self, *names: str, minimum: int = 1) -> int:
        """The first of `names` that is set, as an integer in [minimum, cap]; missing is an error."""
        value = self.opt_int(*names, minimum=minimum)
        if value is None:
            alternatives = " / ".join(self.key(n) for n in names)
            raise ConfigError(alternatives, "is missing; kvplan needs it to size the model", self.source)
        return value

    def opt_int(self, *names: str, minimum: int = 1) -> int | None:
        """Like require_int, but None when none of `names` is set (or it is null)."""
        name, value = self.raw_value(*names)
        if value is None:
            return None
        return self._checked_int(self.key(name), name, value, minimum)

    def _checked_int(self, label: str, name: str, value: Any, minimum: int) -> int:
        # JSON has one number type: 4096.0 is accepted as 4096, 4096.5 and NaN are not.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and (not math.isfinite(value) or value != int(value))
        ):
            raise ConfigError(label, f"must be an integer, got {value!r}", self.source)
        number = int(value)
        if number < minimum:
            raise ConfigError(label, f"must be >= {minimum}, got {value!r}", self.source)
        cap = cap_for(name)
        if number > cap:
            raise ConfigError(label, f"is implausibly large ({value!r} > {cap:,})", self.source)
        return number

    def flag(self, name: str, default: bool) -> bool:
        """A true/false key; `default` when neither the config nor the class defaults set it."""
        value = self.opt_bool(name)
        return default if value is None else value

    def opt_bool(self, name: str) -> bool | None:
        _, value = self.raw_value(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false, got {value!r}")
        return value

    def opt_str(self, name: str) -> str | None:
        _, value = self.raw_value(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(name, f"must be a string, got {value!r}")
        return value

    def opt_list(self, name: str) -> list[Any] | None:
        _, value = self.raw_value(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.error(name, f"must be a list, got {type(value).__name__}")
        return value

    def int_list(self, name: str, *, minimum: int = 1) -> list[int]:
        """A list of integers of any length (Qwen2-MoE's mlp_only_layers); [] when absent."""
        listed = self.opt_list(name)
        if listed is None:
            return []
        return [self._checked_int(f"{self.key(name)}[{i}]", name, item, minimum) for i, item in enumerate(listed)]

    def int_or_per_layer_list(self, name: str, layers: int, *, minimum: int = 1) -> list[int]:
        """One integer for every layer, or a list of `layers` integers (Gemma 3n's intermediate_size)."""
        _, value = self.raw_value(name)
        if not isinstance(value, list):
            return [self.require_int(name, minimum=minimum)] * layers
        if len(value) != layers:
            raise self.error(name, f"has {len(value)} entries for {layers} layers")
        return [self._checked_int(f"{self.key(name)}[{i}]", name, item, minimum) for i, item in enumerate(value)]
