"""One resolver for every command: a model argument -> a parsed ModelSpec, and where it came from.

Order: an existing local path (config.json, params.json, or a directory holding one; for names from untrusted
files only one written as a path, ./name or /path); then, for `org/name` ids, the local Hugging Face cache
and the bundled library, with no network call at all (a bundled model starts as fast as the CLI can); the
Hub only when neither has it, or when --refresh or --revision asks for it, falling back to the library (with
a notice) when the Hub cannot serve the repo. Names that are not repo ids go to the library directly.
"""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path

from kvplan.errors import ConfigError, HubError, ModelNotFoundError
from kvplan.model.parse import parse_config
from kvplan.model.specs import ModelSpec
from kvplan.records import dataclass
from kvplan.sources import library
from kvplan.sources.local_files import MAX_CONFIG_BYTES, Refused, json_object, read_regular
from kvplan.sources.repo_ids import is_repo_id, looks_like_repo_id

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
    """A local JSON config, read bounded (regular files only, at most MAX_CONFIG_BYTES, never blocking)."""
    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
    except Refused as exc:
        raise ModelNotFoundError(f"cannot read {path}: {exc}") from None
    try:
        return json_object(data)
    except Refused as exc:
        raise ConfigError(path.name, str(exc), str(path)) from None


def _exists(path: Path) -> bool:
    """Whether a local path exists; a name no file system can hold is a clear error, not a traceback."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            shown = str(path)
            raise ModelNotFoundError(
                f"'{shown[:60]}...' ({len(shown):,} characters) is too long for a local path "
                "and is no library name or Hub repo id"
            ) from None
        return exc.errno != errno.ENOTDIR  # anything else (EACCES): it exists, and reading it will say why
    except ValueError:  # an embedded NUL, or a lone surrogate: no file can have this name
        return False
    return True


def _from_path(path: Path) -> ModelSpec:
    if path.is_dir():
        for candidate in ("config.json", "params.json"):
            if _exists(path / candidate):
                return _from_path(path / candidate)
        raise ModelNotFoundError(f"directory {path} holds no config.json (nor Meta's params.json)")
    raw = _read_json_file(path)
    quant_path = path.with_name("hf_quant_config.json")
    hf_quant = _read_json_file(quant_path) if _exists(quant_path) else None
    name = path.parent.name if path.name in ("config.json", "params.json") else path.stem
    return parse_config(raw, name=name, source=str(path), hf_quant_config=hf_quant)


def _is_explicit_path(text: str) -> bool:
    """`./llama`, `../models/llama` or `/models/llama`: written as a path, so meant as one."""
    return text.startswith(("./", "../", "/")) or text in (".", "..")


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
    explicit_paths_only: bool = False,
    refresh: bool = False,
) -> Resolved:
    """Resolve MODEL (path, library name or Hub repo id) to a ModelSpec.

    A repo id in the local HF cache or the bundled library is answered from there; `refresh` (or a
    `revision`) asks the Hub instead. prefer_library: the bundled copy wins over the HF cache too (`kvplan
    check` in CI must give the same answer on every machine).
    explicit_paths_only: MODEL comes from an untrusted file (`kvplan check`): it is a local model only when
    written as a path (`./llama`, `/models/llama`); a bare `llama` never looks at the current directory,
    where a FIFO or a planted `llama/config.json` could wait.
    """
    text = model.strip()
    if not text:
        raise ModelNotFoundError("the model argument is empty; give a Hub id, a library name or a config path")
    if explicit_paths_only:
        if _is_explicit_path(text):
            return Resolved(_from_path(Path(text)))
    else:
        path = Path(text).expanduser()
        if _exists(path):
            return Resolved(_from_path(path))

    offline = offline or hub_offline()
    name = text.removeprefix("hf://")
    if not (is_repo_id(name) if explicit_paths_only else looks_like_repo_id(name)):
        return Resolved(_from_library(library.require(text)))  # require raises with "did you mean"
    repo_id = name
    # Only this exact repo (or an alias of it) stands in for it: anyorg/Llama-3.1-8B-Instruct may be a
    # fine-tune, so meta-llama's config is named to the user, never used in its place.
    entry = library.lookup(repo_id, any_org=False)
    namesake = None if entry is not None else library.lookup(repo_id)

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
            if namesake is not None:
                raise HubError(
                    f"{exc}; the bundled library holds {namesake.repo_id} under that name: pass it if it is "
                    "the same model",
                    reason=exc.reason,
                ) from None
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
