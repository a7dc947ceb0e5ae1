"""One resolver for every command: a model argument -> a parsed ModelSpec, and where it came from.

Order: an existing local path (config.json, params.json, or a directory holding one); then, for `org/name`
ids, the local Hugging Face cache and the bundled library, with no network call at all (a bundled model
starts as fast as the CLI can); the Hub only when neither has it, or when --refresh or --revision asks for
it, falling back to the library (with a notice) when the Hub cannot serve the repo. Names that are not repo
ids go to the library directly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from kvplan.errors import ConfigError, HubError, ModelNotFoundError
from kvplan.model.parse import parse_config
from kvplan.model.specs import ModelSpec
from kvplan.sources import library
from kvplan.sources.hub import looks_like_repo_id

_TRUTHY = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Resolved:
    model: ModelSpec
    notices: tuple[str, ...] = ()


def hub_offline() -> bool:
    """HF_HUB_OFFLINE read from the environment only: importing huggingface_hub to ask would cost the
    offline path its fast start."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUTHY


def _read_json_file(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(path.name, f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(path.name, f"must hold a JSON object, not {type(data).__name__}", str(path))
    return data


def _from_path(path: Path) -> ModelSpec:
    if path.is_dir():
        for candidate in ("config.json", "params.json"):
            if (path / candidate).is_file():
                return _from_path(path / candidate)
        raise ModelNotFoundError(f"directory {path} holds no config.json (nor Meta's params.json)")
    raw = _read_json_file(path)
    quant_path = path.with_name("hf_quant_config.json")
    hf_quant = _read_json_file(quant_path) if quant_path.is_file() else None
    name = path.parent.name if path.name in ("config.json", "params.json") else path.stem
    return parse_config(raw, name=name, source=str(path), hf_quant_config=hf_quant)


def _from_library(entry: library.LibraryEntry) -> ModelSpec:
    return parse_config(
        entry.read_config(),
        name=entry.repo_id,
        source=f"bundled library: model_configs/{entry.filename}",
        hf_quant_config=entry.read_hf_quant_config(),
    )


def hf_cache_dir() -> Path:
    """huggingface_hub's cache folder, from the same variables it reads (without importing it)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_config(repo_id: str) -> Path | None:
    """The config.json of `repo_id` at `main` in the local HF cache, if it is there (no network, no import):
    models--ORG--NAME/refs/main holds the commit, snapshots/COMMIT/config.json the file."""
    try:
        repo = hf_cache_dir() / f"models--{repo_id.replace('/', '--')}"
        commit = (repo / "refs" / "main").read_text(encoding="ascii").strip()
        config = repo / "snapshots" / commit / "config.json"
        return config if commit and config.is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def resolve_model(
    model: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    offline: bool = False,
    prefer_library: bool = False,
    refresh: bool = False,
    untrusted: bool = False,
) -> Resolved:
    """Resolve MODEL (path, library name or Hub repo id) to a ModelSpec.

    A repo id in the local HF cache or the bundled library is answered from there; `refresh` (or a
    `revision`) asks the Hub instead. prefer_library: the bundled copy wins over the HF cache too (`kvplan
    check` in CI must give the same answer on every machine). untrusted: the name comes from a file kvplan
    did not write (a deployment YAML): only an explicit `./path` or an absolute path is read from disk, so
    `model: llama` never opens ./llama.
    """
    text = model.strip()
    if not text:
        raise ModelNotFoundError("the model argument is empty; give a Hub id, a library name or a config path")
    path = Path(text).expanduser()
    explicit = text.startswith(("./", "../", "/", "~"))
    if (explicit or not untrusted) and path.exists():
        return Resolved(_from_path(path))

    entry = library.lookup(text)
    offline = offline or hub_offline()
    if not looks_like_repo_id(text.removeprefix("hf://")):
        if entry is None:
            library.require(text)  # raises with "did you mean"
        return Resolved(_from_library(entry))
    repo_id = text.removeprefix("hf://")

    if (offline or prefer_library) and entry is not None and revision is None:
        return Resolved(_from_library(entry))
    if revision is None and not refresh:
        cached = cached_config(repo_id)
        if cached is not None:
            spec = _from_path(cached)
            return Resolved(replace(spec, name=repo_id, source=f"HF cache: {cached}"))
        if entry is not None:
            return Resolved(_from_library(entry))

    from kvplan.sources import hub  # the only module that touches the network (huggingface_hub loads on first call)

    try:
        files = hub.fetch_model_files(repo_id, revision=revision, token=token, offline=offline)
    except HubError as exc:
        if entry is None:
            hint = library.suggestions(repo_id)
            if hint and exc.reason in ("not_found", "offline", "network"):
                raise HubError(f"{exc} (bundled library has: {', '.join(hint)})", reason=exc.reason) from None
            raise
        return Resolved(
            _from_library(entry),
            notices=(f"{exc}; using the bundled library's copy ({entry.filename}) instead",),
        )
    source = f"hub: {repo_id}@{files.revision} ({files.config_filename})"
    raw = files.config if files.config is not None else files.params
    return Resolved(parse_config(raw, name=repo_id, source=source, hf_quant_config=files.hf_quant_config))
