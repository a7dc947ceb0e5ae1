"""Fetch model configs and safetensors header sizes from the Hugging Face Hub: kvplan's only networked module.

Every call is bounded (kvplan.sources.hub_limits: a total deadline, size caps, a request budget, few retries),
quiet (no progress bars, no retry warnings from huggingface_hub on stderr), sends no telemetry, and ends in a
result or one HubError line whose `reason` lets the resolver fall back to the cache or the bundled library.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from kvplan.errors import ConfigError, HubError, InputError, KvplanError
from kvplan.records import dataclass
from kvplan.sources.local_files import MAX_CONFIG_BYTES, Refused, json_object, read_regular
from kvplan.units import MiB

DEFAULT_REVISION = "main"
CONFIG_FILENAME = "config.json"
META_PARAMS_FILENAME = "params.json"  # Meta's original checkpoints (meta-llama/Llama-2-7b) ship only this
QUANT_CONFIG_FILENAME = "hf_quant_config.json"  # NVIDIA ModelOpt checkpoints describe their quantization here
SAFETENSORS_SINGLE_FILENAME = "model.safetensors"

# Why a HubError happened, so the resolver can fall back to the bundled library and say why.
HUB_ERROR_REASONS = frozenset(
    {"gated", "auth", "not_found", "no_config", "revision", "offline", "network", "no_weights", "bad_weights",
     "too_large", "cache", "bad_answer"}
)

# One kvplan Hub call (a model's config files, or a checkpoint's safetensors headers) ends within this many
# seconds, retries included; KVPLAN_HUB_TIMEOUT sets another. huggingface_hub alone would wait as long as bytes
# keep trickling in, and retry a stalled body for 68 s.
HUB_TIMEOUT_ENV = "KVPLAN_HUB_TIMEOUT"
DEFAULT_HUB_TIMEOUT_S = 30.0
# Checkpoints: the largest in the library has 163 shards (DeepSeek-V3), Llama-3.1-405B 191.
MAX_SHARDS = 1024
# An index naming ~100,000 tensors is ~9 MB, a shard's header ~0.1 MB: 64 MiB per answer, 256 MiB in all.
MAX_SAFETENSORS_ANSWER_BYTES = 64 * MiB
MAX_SAFETENSORS_TOTAL_BYTES = 256 * MiB
# A tensor beyond 2**48 bytes (256 TiB) or a dimension beyond 2**48 is a corrupt header, not a model.
_MAX_TENSOR_BYTES = 1 << 48
_MAX_DIMS = 8
_DTYPE_RE = re.compile(r"[A-Za-z0-9_]{1,16}")  # safetensors names its dtypes F16, BF16, F8_E4M3, I64, BOOL, ...

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


def fetch_model_files(
    repo_id: str, *, revision: str | None = None, token: str | None = None, offline: bool = False
) -> HubFiles:
    """Download (or read from the cache) a repo's config.json, or Meta's params.json, and hf_quant_config.json.

    offline=True (kvplan's --offline) reads the cache only, as HF_HUB_OFFLINE does.
    """
    request = _request(repo_id, revision, token)
    limits = _limits(MAX_CONFIG_BYTES, 3 * MAX_CONFIG_BYTES, max_requests=24)
    with _kvplan_call(limits):
        try:
            if offline or _offline_mode():
                return _files_from_cache(request, unreachable=None)
            try:
                return _files_from_hub(request)
            except _Unreachable as down:
                # huggingface_hub itself falls back to the cache when the Hub is down; kvplan does the same, but
                # only after a single HEAD without retries (its own fallback retries for ~23 s first: _check_repo).
                return _files_from_cache(request, unreachable=down.error)
        except KvplanError:
            raise
        except Exception as err:  # noqa: BLE001 - the cache look-up too: every failure is one HubError line
            raise _as_hub_error(err, request, unreachable_is_error=True) from err


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
    limits = _limits(MAX_SAFETENSORS_ANSWER_BYTES, MAX_SAFETENSORS_TOTAL_BYTES, max_requests=2 * MAX_SHARDS + 16)
    with _kvplan_call(limits):
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
            raise _bad_weights(repo_id, str(err)) from None
        except Exception as err:  # noqa: BLE001 - every other failure is mapped to one HubError line
            mapped = _as_hub_error(err, request, unreachable_is_error=True)
            if isinstance(mapped, HubError) and mapped.reason == "bad_answer":  # a header huggingface_hub choked on
                mapped = _bad_weights(repo_id, f"{type(err).__name__}: {' '.join(str(err).split())[:200]}")
            elif isinstance(mapped, HubError) and mapped.reason == "too_large":
                mapped = _hub_error("too_large", f"{mapped}; kvplan reads checkpoints of up to {MAX_SHARDS:,} shards")
            raise mapped from err
    return _sum_tensor_bytes(repo_id, metadata)


def _sum_tensor_bytes(repo_id: str, metadata: Any) -> SafetensorsBytes:
    """The checkpoint's bytes by dtype, from headers checked value by value (a hostile header is one error line)."""
    files = getattr(metadata, "files_metadata", None)
    if not isinstance(files, dict):
        raise _bad_weights(repo_id, "the headers hold no file list")
    if len(files) > MAX_SHARDS:
        raise _bad_weights(repo_id, f"{len(files):,} shards, more than the {MAX_SHARDS:,} kvplan reads")
    bytes_by_dtype: dict[str, int] = {}
    num_params = 0
    for filename, file_metadata in files.items():
        tensors = getattr(file_metadata, "tensors", None)
        if not isinstance(tensors, dict):
            raise _bad_weights(repo_id, f"{str(filename)[:80]} has no tensor table")
        for name, tensor in tensors.items():
            where = f"tensor {str(name)[:80]} in {str(filename)[:80]}"
            dtype, shape, offsets = tensor.dtype, tensor.shape, tensor.data_offsets
            if not isinstance(dtype, str) or not _DTYPE_RE.fullmatch(dtype):
                raise _bad_weights(repo_id, f"{where} has dtype {str(dtype)[:20]!r}")
            if not isinstance(shape, (list, tuple)) or len(shape) > _MAX_DIMS or not all(map(_size, shape)):
                raise _bad_weights(repo_id, f"{where} has shape {str(shape)[:60]}")
            if not isinstance(offsets, (list, tuple)) or len(offsets) != 2 or not all(map(_size, offsets)):
                raise _bad_weights(repo_id, f"{where} has data_offsets {str(offsets)[:60]}")
            begin, end = offsets
            if not begin <= end:
                raise _bad_weights(repo_id, f"{where} has data_offsets [{begin}, {end}]")
            # The byte span in the file is exact for every dtype, packed 4-bit and fp8 included: no size table.
            bytes_by_dtype[dtype] = bytes_by_dtype.get(dtype, 0) + (end - begin)
            count = 1
            for dim in shape:
                count *= dim
            num_params += count
    return SafetensorsBytes(
        total_bytes=sum(bytes_by_dtype.values()),
        by_dtype=tuple(sorted(bytes_by_dtype.items())),
        num_params=num_params,
        files=len(files),
    )


def _size(value: object) -> bool:
    """A dimension or offset as a header may state it: a plain integer in [0, 2**48]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_TENSOR_BYTES


def _bad_weights(repo_id: str, problem: str) -> HubError:
    return _hub_error("bad_weights", f"cannot read the safetensors headers of {repo_id}: {problem}")


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


def hub_timeout_s() -> float:
    """Seconds one kvplan Hub call may take in all (KVPLAN_HUB_TIMEOUT, default 30)."""
    raw = os.environ.get(HUB_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_HUB_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise InputError(f"{HUB_TIMEOUT_ENV} must be a number of seconds in (0, 3600], got {raw[:40]!r}")
    return seconds


def _limits(max_answer_bytes: int, max_total_bytes: int, *, max_requests: int) -> Any:
    from kvplan.sources.hub_limits import Limits

    return Limits(deadline_s=hub_timeout_s(), max_response_bytes=max_answer_bytes, max_total_bytes=max_total_bytes,
                  max_requests=max_requests)


@contextmanager
def _kvplan_call(limits: Any) -> Iterator[None]:
    """One bounded, quiet Hub call: huggingface_hub's progress bars, log lines and telemetry off, then restored.

    stderr is for kvplan's own messages: without this, huggingface_hub prints "Trying to resume download..."
    and "Retrying in 1s" lines even when the call succeeds.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from huggingface_hub.utils import logging as hf_logging

    from kvplan.sources.hub_limits import bounded_client

    bars_were_disabled, verbosity = are_progress_bars_disabled(), hf_logging.get_verbosity()
    telemetry_was_disabled = constants.HF_HUB_DISABLE_TELEMETRY
    disable_progress_bars()
    hf_logging.set_verbosity(hf_logging.CRITICAL)
    constants.HF_HUB_DISABLE_TELEMETRY = True  # read at each request: no agent probe, no library versions sent
    try:
        with bounded_client(limits):
            yield
    finally:
        constants.HF_HUB_DISABLE_TELEMETRY = telemetry_was_disabled
        hf_logging.set_verbosity(verbosity)
        if not bars_were_disabled:
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
        raise _as_hub_error(err, request, unreachable_is_error=False) from err


def _check_repo(request: _Request, filename: str, *, unreachable_is_error: bool) -> None:
    """One HEAD without retries on a file of the repo: raises the HubError for a gated/missing repo or revision.

    hf_hub_download retries a failed HEAD with back-off (1 + 2 + 4 + 8 + 8 = 23 s) when nothing is cached, so a
    down Hub would stall kvplan; this HEAD fails in milliseconds on a refused connection. A missing file is fine
    here: the repo and the revision exist.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import FileMetadataError, RemoteEntryNotFoundError

    url = hf_hub_url(request.repo_id, filename, revision=request.revision, endpoint=request.endpoint)
    try:
        metadata = get_hf_file_metadata(
            url, token=request.token, timeout=constants.HF_HUB_ETAG_TIMEOUT, endpoint=request.endpoint
        )
    except RemoteEntryNotFoundError:
        return
    except Exception as err:  # noqa: BLE001 - mapped to one HubError line (or to the cache fallback)
        raise _as_hub_error(err, request, unreachable_is_error=unreachable_is_error) from err
    if metadata.commit_hash is None or metadata.etag is None:
        # A 200 from a proxy or a captive portal: no X-Repo-Commit / ETag, so not a Hub.
        raise _as_hub_error(FileMetadataError(url), request, unreachable_is_error=unreachable_is_error)


def _as_hub_error(err: BaseException, request: _Request, *, unreachable_is_error: bool) -> Exception:
    """Map any failure of a huggingface_hub call to one HubError line (or _Unreachable for the cache fallback).

    Every exception maps: a Hub refusal to its reason, a transport failure or a deadline to "network", an answer
    beyond the size caps to "too_large", an unusable cache to "cache", and anything else to "bad_answer", which
    names the exception (KVPLAN_DEBUG=1 shows its traceback).
    """
    import httpx2
    from huggingface_hub.errors import (
        DisabledRepoError,
        FileMetadataError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from kvplan.sources.hub_limits import HubLimitError

    repo_id, endpoint = request.repo_id, request.endpoint
    if isinstance(err, LocalEntryNotFoundError):
        # "Cannot find the requested files in the local cache": the Hub failed first, and that failure says why.
        underlying = err.__cause__ or err.__context__
        if isinstance(underlying, Exception) and not isinstance(underlying, LocalEntryNotFoundError):
            return _as_hub_error(underlying, request, unreachable_is_error=unreachable_is_error)
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
    if isinstance(err, HubLimitError) and err.kind in ("size", "requests"):
        return _hub_error(
            "too_large",
            f"the Hub at {endpoint} sent more than kvplan reads for {repo_id} ({err.cause}); kvplan refused it",
        )
    if isinstance(err, HubLimitError):
        cause = err.cause
    elif isinstance(err, HfHubHTTPError) and err.response is not None:
        status = err.response.status_code
        if status == 401:
            # A 401 that is neither RepoNotFound nor GatedRepo: the Hub rejected the token itself.
            return _hub_error("auth", f"the Hub at {endpoint} rejected the token: check --token or HF_TOKEN")
        cause = f"HTTP {status}"
    elif isinstance(err, httpx2.TimeoutException):
        cause = "timed out"
    elif isinstance(err, httpx2.TooManyRedirects):
        cause = "a redirect loop"
    elif isinstance(err, (httpx2.TransportError, httpx2.DecodingError)):
        cause = " ".join((str(err) or type(err).__name__).split())[:200]
    elif isinstance(err, FileMetadataError):
        cause = "it answers without the X-Repo-Commit/ETag headers of a Hub: a proxy or a captive portal?"
    elif isinstance(err, OSError) and not isinstance(err, HfHubHTTPError):
        from huggingface_hub import constants

        problem = err.strerror or " ".join(str(err).split())[:200]
        return _hub_error(
            "cache",
            f"the Hugging Face cache at {constants.HF_HUB_CACHE} cannot be used ({problem}); set HF_HOME to a "
            "writable directory",
        )
    else:
        return _hub_error(
            "bad_answer",
            f"the Hub at {endpoint} gave an answer kvplan cannot use for {repo_id} "
            f"({type(err).__name__}: {' '.join(str(err).split())[:200]})",
        )
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
    """Parse one downloaded (or cached) JSON file, read bounded like a local config."""
    source = f"{request.repo_id} at revision {request.revision}"
    try:
        return json_object(read_regular(path, MAX_CONFIG_BYTES, "config files"))
    except Refused as err:
        raise ConfigError(filename, str(err), source) from None
