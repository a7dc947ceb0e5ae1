"""Fetch model configs and safetensors header sizes from the Hugging Face Hub: kvplan's only networked module."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from kvplan.errors import ConfigError, HubError

DEFAULT_REVISION = "main"
CONFIG_FILENAME = "config.json"
META_PARAMS_FILENAME = "params.json"  # Meta's original checkpoints (meta-llama/Llama-2-7b) ship only this
QUANT_CONFIG_FILENAME = "hf_quant_config.json"  # NVIDIA ModelOpt checkpoints describe their quantization here
SAFETENSORS_SINGLE_FILENAME = "model.safetensors"

# Why a HubError happened, so the resolver can fall back to the bundled library and say why.
HUB_ERROR_REASONS = frozenset(
    {"gated", "auth", "not_found", "no_config", "revision", "offline", "network", "no_weights", "bad_weights"}
)

# An `org/name` repo id as the Hub accepts it: each part starts and ends with a letter or digit, at most 96
# characters, no "--" or ".." (the Hub reserves those).
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_REPO_ID_MAX_CHARS = 96
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own reading of boolean environment variables


@dataclass(frozen=True)
class HubFiles:
    """The config files of one Hub repo at one revision, parsed."""

    repo_id: str
    revision: str  # the requested revision ("main" by default), not the commit it resolved to
    config: dict | None  # parsed config.json, or None when the repo has none
    params: dict | None  # parsed Meta-format params.json when config.json is absent
    hf_quant_config: dict | None  # companion hf_quant_config.json when the repo ships one
    config_filename: str  # "config.json" or "params.json"
    from_cache: bool = False  # True when the Hub was unreachable or HF_HUB_OFFLINE is set and the cache answered


@dataclass(frozen=True)
class SafetensorsBytes:
    """Exact tensor bytes of a repo's safetensors checkpoint, read from the file headers only."""

    total_bytes: int
    by_dtype: tuple[tuple[str, int], ...]  # (safetensors dtype, bytes), sorted by dtype name
    num_params: int
    files: int  # 1 for model.safetensors, the shard count for a sharded checkpoint


@dataclass(frozen=True)
class _Request:
    repo_id: str
    revision: str
    token: str | None
    endpoint: str


class _Unreachable(Exception):
    """The Hub did not answer; carries the HubError to raise if the cache cannot stand in."""

    def __init__(self, error: HubError) -> None:
        super().__init__(str(error))
        self.error = error


def looks_like_repo_id(text: str) -> bool:
    """True for an `org/name` Hub repo id that is not an existing local path ("meta-llama/Llama-2-7b")."""
    if len(text) > _REPO_ID_MAX_CHARS or not _REPO_ID_RE.match(text) or "--" in text or ".." in text:
        return False
    # "models/config.json" that does not exist is a mistyped path far more often than a repo named *.json.
    if text.endswith(".json"):
        return False
    return not Path(text).expanduser().exists()


def fetch_model_files(
    repo_id: str, *, revision: str | None = None, token: str | None = None, offline: bool = False
) -> HubFiles:
    """Download (or read from the cache) a repo's config.json, or Meta's params.json, and hf_quant_config.json.

    offline=True (kvplan's --offline) reads the cache only, as HF_HUB_OFFLINE does.
    """
    request = _request(repo_id, revision, token)
    with _quiet_progress_bars():
        if offline or _offline_mode():
            return _files_from_cache(request, unreachable=None)
        try:
            return _files_from_hub(request)
        except _Unreachable as down:
            # huggingface_hub itself falls back to the cache when the Hub is down; kvplan does the same, but
            # only after a single HEAD without retries (its own fallback retries for ~23 s first: _check_repo).
            return _files_from_cache(request, unreachable=down.error)


def fetch_safetensors_bytes(repo_id: str, *, revision: str | None = None, token: str | None = None) -> SafetensorsBytes:
    """Sum the tensor bytes in a repo's safetensors headers (ranged GETs: no weights are downloaded)."""
    request = _request(repo_id, revision, token)
    if _offline_mode():
        raise _hub_error(
            "offline",
            f"reading the safetensors headers of {repo_id} needs the Hub, and HF_HUB_OFFLINE is set; "
            "unset HF_HUB_OFFLINE or give the weight size with --weights-bytes",
        )
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import NotASafetensorsRepoError, RemoteEntryNotFoundError, SafetensorsParsingError

    api = HfApi(endpoint=request.endpoint, token=token)
    with _quiet_progress_bars():
        try:
            metadata = api.get_safetensors_metadata(
                repo_id, revision=request.revision, token=token, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
            )
        except NotASafetensorsRepoError:
            # get_safetensors_metadata answers "not a safetensors repo" for a missing repo or revision too:
            # one HEAD on model.safetensors tells which it is.
            _check_repo(request, SAFETENSORS_SINGLE_FILENAME, unreachable_is_error=True)
            raise _hub_error(
                "no_weights",
                f"{repo_id} has no {SAFETENSORS_SINGLE_FILENAME} nor model.safetensors.index.json at revision "
                f"{request.revision}; give the weight size with --weights-bytes",
            ) from None
        except RemoteEntryNotFoundError as err:
            # The index names a shard the repo does not hold.
            missing = err.response.url.path.rsplit("/", 1)[-1] if err.response is not None else "a shard"
            raise _hub_error(
                "bad_weights",
                f"{repo_id} lists {missing} in model.safetensors.index.json, but the Hub has no such file at "
                f"revision {request.revision}; give the weight size with --weights-bytes",
            ) from None
        except SafetensorsParsingError as err:
            raise _hub_error("bad_weights", f"cannot read the safetensors headers of {repo_id}: {err}") from None
        except Exception as err:  # noqa: BLE001 - every other client failure is mapped to one HubError line
            raise _as_hub_error(err, request, unreachable_is_error=True) from None

    bytes_by_dtype: dict[str, int] = {}
    num_params = 0
    for filename, file_metadata in metadata.files_metadata.items():
        for name, tensor in file_metadata.tensors.items():
            begin, end = tensor.data_offsets
            if not 0 <= begin <= end:
                raise _hub_error(
                    "bad_weights",
                    f"cannot read the safetensors headers of {repo_id}: tensor {name} in {filename} has "
                    f"data_offsets [{begin}, {end}]",
                )
            # The byte span in the file is exact for every dtype, packed 4-bit and fp8 included: no size table.
            bytes_by_dtype[tensor.dtype] = bytes_by_dtype.get(tensor.dtype, 0) + (end - begin)
            num_params += tensor.parameter_count
    return SafetensorsBytes(
        total_bytes=sum(bytes_by_dtype.values()),
        by_dtype=tuple(sorted(bytes_by_dtype.items())),
        num_params=num_params,
        files=len(metadata.files_metadata),
    )


def _request(repo_id: str, revision: str | None, token: str | None) -> _Request:
    return _Request(repo_id=repo_id, revision=revision or DEFAULT_REVISION, token=token, endpoint=_endpoint())


def _endpoint() -> str:
    # huggingface_hub copies HF_ENDPOINT into constants.ENDPOINT when it is first imported. Reading the
    # environment at call time and passing `endpoint=` explicitly keeps every request on the endpoint the user
    # set now, even when something imported huggingface_hub earlier in the process.
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def _offline_mode() -> bool:
    # Same reasoning as _endpoint: the environment now, or what huggingface_hub read at import (its HTTP
    # session refuses every request in that case anyway).
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return env.upper() in _TRUE_VALUES or constants.is_offline_mode()


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Silence huggingface_hub's tqdm bars (stderr is for kvplan's messages), restoring the caller's setting."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


def _files_from_hub(request: _Request) -> HubFiles:
    _check_repo(request, CONFIG_FILENAME, unreachable_is_error=False)
    config_path = _download(request, CONFIG_FILENAME)
    params_path = None if config_path else _download(request, META_PARAMS_FILENAME)
    if config_path is None and params_path is None:
        _raise_no_config(request)
    quant_path = _download(request, QUANT_CONFIG_FILENAME) if config_path else None
    return _parsed(request, config_path, params_path, quant_path, from_cache=False)


def _files_from_cache(request: _Request, unreachable: HubError | None) -> HubFiles:
    from huggingface_hub import try_to_load_from_cache

    # try_to_load_from_cache gives a path, None (not cached), or a marker object for a file that an earlier
    # online look-up found absent (huggingface_hub records those under .no_exist/).
    found = {
        filename: try_to_load_from_cache(request.repo_id, filename, revision=request.revision)
        for filename in (CONFIG_FILENAME, META_PARAMS_FILENAME, QUANT_CONFIG_FILENAME)
    }
    paths = {filename: value for filename, value in found.items() if isinstance(value, str)}
    config_path = paths.get(CONFIG_FILENAME)
    params_path = None if config_path else paths.get(META_PARAMS_FILENAME)
    if config_path or params_path:
        quant_path = paths.get(QUANT_CONFIG_FILENAME) if config_path else None
        return _parsed(request, config_path, params_path, quant_path, from_cache=True)
    if found[CONFIG_FILENAME] is not None and found[META_PARAMS_FILENAME] is not None:
        _raise_no_config(request)
    if unreachable is not None:
        raise unreachable
    raise _hub_error(
        "offline",
        f"{request.repo_id} (revision {request.revision}) is not in the local cache and kvplan is offline "
        "(--offline or HF_HUB_OFFLINE); run once online to cache its config",
    )


def _download(request: _Request, filename: str) -> str | None:
    """Local path of one repo file, fetched into huggingface_hub's cache; None when the repo lacks it."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        return hf_hub_download(
            request.repo_id,
            filename,
            revision=request.revision,
            token=request.token,
            endpoint=request.endpoint,
            etag_timeout=constants.HF_HUB_ETAG_TIMEOUT,
        )
    except RemoteEntryNotFoundError:
        return None  # huggingface_hub also records the absence in the cache, which offline runs then trust
    except Exception as err:  # noqa: BLE001 - mapped to one HubError line (or to the cache fallback)
        raise _as_hub_error(err, request, unreachable_is_error=False) from None


def _check_repo(request: _Request, filename: str, *, unreachable_is_error: bool) -> None:
    """One HEAD without retries on a file of the repo: raises the HubError for a gated/missing repo or revision.

    hf_hub_download retries a failed HEAD with back-off (1 + 2 + 4 + 8 + 8 = 23 s) when nothing is cached, so a
    down Hub would stall kvplan; this HEAD fails in milliseconds on a refused connection. A missing file is fine
    here: the repo and the revision exist.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import RemoteEntryNotFoundError

    url = hf_hub_url(request.repo_id, filename, revision=request.revision, endpoint=request.endpoint)
    try:
        get_hf_file_metadata(url, token=request.token, timeout=constants.HF_HUB_ETAG_TIMEOUT, endpoint=request.endpoint)
    except RemoteEntryNotFoundError:
        pass
    except Exception as err:  # noqa: BLE001 - mapped to one HubError line (or to the cache fallback)
        raise _as_hub_error(err, request, unreachable_is_error=unreachable_is_error) from None


def _as_hub_error(err: Exception, request: _Request, *, unreachable_is_error: bool) -> Exception:
    """Map a huggingface_hub / transport failure to a one-line HubError (or _Unreachable for the cache fallback)."""
    import httpx2
    from huggingface_hub.errors import (
        DisabledRepoError,
        FileMetadataError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, endpoint = request.repo_id, request.endpoint
    # GatedRepoError subclasses RepositoryNotFoundError: test it first.
    if isinstance(err, GatedRepoError):
        return _hub_error(
            "gated",
            f"{repo_id} is gated on the Hugging Face Hub: accept its licence on {endpoint}/{repo_id} "
            "and pass --token or set HF_TOKEN",
        )
    if isinstance(err, DisabledRepoError):
        return _hub_error("not_found", f"{repo_id} is disabled on the Hub (its owner or the Hub turned access off)")
    if isinstance(err, RepositoryNotFoundError):
        return _hub_error(
            "not_found", f"{repo_id} not found on the Hub (check the spelling, or pass --token for a private repo)"
        )
    if isinstance(err, RevisionNotFoundError):
        return _hub_error(
            "revision", f"{repo_id} has no revision '{request.revision}' on the Hub (check --revision)"
        )
    if isinstance(err, OfflineModeIsEnabled):
        return _hub_error(
            "offline",
            f"{repo_id} needs the Hub and HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE to download it once",
        )
    if isinstance(err, HfHubHTTPError) and err.response is not None:
        status = err.response.status_code
        if status == 401:
            # A 401 that is neither RepoNotFound nor GatedRepo: the Hub rejected the token itself.
            return _hub_error("auth", f"the Hub at {endpoint} rejected the token: check --token or HF_TOKEN")
        cause = f"HTTP {status}"
    elif isinstance(err, httpx2.TimeoutException):
        cause = "timed out"
    elif isinstance(err, httpx2.TransportError):
        cause = str(err) or type(err).__name__
    elif isinstance(err, FileMetadataError):
        cause = "it answers without the X-Repo-Commit/ETag headers of a Hub"
    else:
        raise err  # not a Hub failure: a bug, so keep the traceback
    error = _hub_error(
        "network",
        f"cannot reach the Hub at {endpoint} ({cause}); set HF_HUB_OFFLINE=1 to use the cache or the bundled library",
    )
    return error if unreachable_is_error else _Unreachable(error)


def _raise_no_config(request: _Request) -> NoReturn:
    raise _hub_error(
        "no_config",
        f"{request.repo_id} has no {CONFIG_FILENAME} (nor Meta's {META_PARAMS_FILENAME}) "
        f"at revision {request.revision}",
    )


def _hub_error(reason: str, message: str) -> HubError:
    return HubError(message, reason=reason)  # reason: one of HUB_ERROR_REASONS


def _parsed(
    request: _Request, config_path: str | None, params_path: str | None, quant_path: str | None, *, from_cache: bool
) -> HubFiles:
    return HubFiles(
        repo_id=request.repo_id,
        revision=request.revision,
        config=_load_json_object(config_path, CONFIG_FILENAME, request) if config_path else None,
        params=_load_json_object(params_path, META_PARAMS_FILENAME, request) if params_path else None,
        hf_quant_config=_load_json_object(quant_path, QUANT_CONFIG_FILENAME, request) if quant_path else None,
        config_filename=CONFIG_FILENAME if config_path else META_PARAMS_FILENAME,
        from_cache=from_cache,
    )


def _load_json_object(path: str, filename: str, request: _Request) -> dict[str, Any]:
    """Parse one downloaded JSON file; json accepts the Infinity/NaN some configs hold."""
    source = f"{request.repo_id} at revision {request.revision}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(filename, "is not UTF-8 text", source) from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            filename, f"is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})", source
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(filename, f"must hold a JSON object, not a {type(data).__name__}", source)
    return data
