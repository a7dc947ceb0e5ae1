"""Every failure kvplan expects, as one exception family with documented exit codes.

The CLI turns any `KvplanError` into one line on stderr, `Error: <message>`, and exits with
`exit_code`; nothing else is printed unless KVPLAN_DEBUG=1 (then the traceback follows).
"""

from __future__ import annotations

# Exit codes, documented in the README. They are shared by every command.
EXIT_OK = 0  # the plan fits / the check passed / verify matched
EXIT_DOES_NOT_FIT = 1  # evaluated, and the answer is "no" (or verify measured a mismatch)
EXIT_CANNOT_EVALUATE = 2  # bad input, unreachable model, missing dependency: no answer at all


class KvplanError(Exception):
    """An expected failure with a one-line, actionable message."""

    exit_code = EXIT_CANNOT_EVALUATE

    def __init__(self, message: str) -> None:
        # One line only: the CLI prints exactly this after "Error: ".
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(KvplanError):
    """A model config that is malformed, contradicts itself, or is not understood. Names the key."""

    def __init__(self, key: str, problem: str, source: str | None = None) -> None:
        self.key = key
        where = f" in {source}" if source else ""
        super().__init__(f"config key '{key}'{where}: {problem}")


class InputError(KvplanError):
    """A bad flag or value given by the user (unknown dtype, GPU, size, ...)."""


class FieldError(InputError):
    """A value of one deployment field that kvplan or the engine cannot take.

    `field` is the canonical name ("workload.max_model_len", "parallelism.tp", "engine.block_size"); the
    message reads without a flag name, because each front end says it its own way: the CLI as `--seq 0`, `check`
    as the YAML key at its line. str() prefixes the canonical name so a library caller still sees which value.
    """

    def __init__(self, field: str, problem: str, value: object = None) -> None:
        self.field = field
        self.problem = " ".join(str(problem).split())
        self.value = value
        super().__init__(f"{field}: {self.problem}")

    def phrased(self, name: str) -> str:
        """The message with the field as the front end names it: `--seq 0 must be >= 1`."""
        shown = name if self.value is None else f"{name} {self.value}"
        return f"{shown}: {self.problem}"


class ModelNotFoundError(KvplanError):
    """The model name resolves to nothing: not a path, not in the library, not on the Hub."""


class HubError(KvplanError):
    """The Hugging Face Hub could not provide the config (gated, missing, offline, ...).

    `reason` says which (kvplan.sources.hub.HUB_ERROR_REASONS) so the resolver can fall back to the library.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class DeploymentError(KvplanError):
    """A deployment file that cannot be read or evaluated (used by `kvplan check`)."""


class DeviceError(KvplanError):
    """`kvplan verify` could not run on the device (torch missing, out of memory, ...)."""
