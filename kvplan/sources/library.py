"""The bundled offline model library (kvplan/model_configs): lookup by repo id, short name or alias."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

from kvplan.errors import ConfigError, ModelNotFoundError
from kvplan.records import dataclass

_COMPANIONS = (".hf_quant_config", ".params")


@dataclass(frozen=True)
class LibraryEntry:
    stem: str  # file name without .json: "meta-llama__Llama-2-7b-hf"
    repo_id: str  # "meta-llama/Llama-2-7b-hf"

    @property
    def filename(self) -> str:
        return f"{self.stem}.json"

    def read_config(self) -> dict:
        return _read_json(self.filename)

    def read_hf_quant_config(self) -> dict | None:
        name = f"{self.stem}.hf_quant_config.json"
        return _read_json(name) if _exists(name) else None


@lru_cache(maxsize=1)
def _root() -> Path:
    """The installed package folder kvplan/model_configs; from a source checkout (or an editable install,
    which maps the package to the checkout), the top-level model_configs/. A plain path rather than
    importlib.resources: that module pulls in zipfile and tempfile, 9 ms of every start, for zip installs
    pip never makes."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "model_configs"
    return installed if installed.is_dir() else package.parent / "model_configs"


def _exists(name: str) -> bool:
    return _root().joinpath(name).is_file()


def _read_json(name: str) -> dict:
    text = _root().joinpath(name).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(name, f"is not valid JSON (line {exc.lineno}: {exc.msg})", "the bundled library") from None


@lru_cache(maxsize=1)
def entries() -> tuple[LibraryEntry, ...]:
    """Every model config in the library, sorted by repo id."""
    out = []
    for item in _root().iterdir():
        name = item.name
        if not name.endswith(".json") or name == "aliases.json":
            continue
        stem = name[: -len(".json")]
        if stem.endswith(_COMPANIONS):
            continue
        org, _, model = stem.partition("__")
        out.append(LibraryEntry(stem=stem, repo_id=f"{org}/{model}" if model else stem))
    return tuple(sorted(out, key=lambda e: e.repo_id.lower()))


@lru_cache(maxsize=1)
def _index() -> dict[str, LibraryEntry]:
    """Lowercase names -> entry: 'org/name', 'name' (when only one org has it), and aliases.json."""
    index: dict[str, LibraryEntry] = {}
    short: dict[str, list[LibraryEntry]] = {}
    by_stem = {e.stem: e for e in entries()}
    for e in entries():
        index[e.repo_id.lower()] = e
        index[e.stem.lower()] = e
        short.setdefault(e.repo_id.split("/")[-1].lower(), []).append(e)
    for name, found in short.items():
        if len(found) == 1:
            index.setdefault(name, found[0])
    if _exists("aliases.json"):
        for alias, stem in _read_json("aliases.json").items():
            if stem in by_stem:
                index.setdefault(alias.lower(), by_stem[stem])
    return index


def lookup(name: str, *, any_org: bool = True) -> LibraryEntry | None:
    """The library entry for `name` (case-insensitive, with or without the org), or None.

    any_org=False: an `org/name` matches only that repo (or an alias of it), not the library's model of the
    same name under another org.
    """
    key = name.strip().lower().removeprefix("hf://").rstrip("/")
    index = _index()
    if key in index:
        return index[key]
    if not any_org:
        return None
    return index.get(key.split("/")[-1]) if "/" in key and key.split("/")[-1] in index else None


def suggestions(name: str, n: int = 3) -> list[str]:
    """Close library names for a "did you mean" hint."""
    key = name.strip().lower()
    names = {e.repo_id.lower(): e.repo_id for e in entries()}
    shorts = {e.repo_id.split("/")[-1].lower(): e.repo_id for e in entries()}
    found = difflib.get_close_matches(key, list(names), n=n, cutoff=0.6)
    found += difflib.get_close_matches(key.split("/")[-1], list(shorts), n=n, cutoff=0.6)
    out: list[str] = []
    for f in found:
        repo = names.get(f) or shorts[f]
        if repo not in out:
            out.append(repo)
    return out[:n]


def require(name: str) -> LibraryEntry:
    entry = lookup(name)
    if entry is None:
        hint = suggestions(name)
        did_you_mean = f"; did you mean {', '.join(hint)}?" if hint else ""
        raise ModelNotFoundError(
            f"model '{name}' is not in the bundled library{did_you_mean} (see `kvplan models`)"
        )
    return entry
