"""A box's measured terms: built from a start-up log, saved as a versioned JSON file, loaded by --profile.

The file (`kvplan calibrate LOG --save box.json`):
    {"kvplan_profile": 1,
     "profile": {"source": ..., "engine": "vllm", "engine_version": "0.19.0", "gpu_name": "H100-80GB",
                 "total_memory_bytes": 85030088130, "tp": 1, "pp": 1, "non_torch_bytes": ..., "cuda_graph_bytes": ...,
                 "model": "codellama/CodeLlama-7b-hf", "max_num_batched_tokens": 8192, "max_num_seqs": 1024,
                 "weights_bytes": ..., "activation_peak_bytes": ...},
     "provenance": {"total_memory_bytes": "measured: line 4 ...", ...}}
Sizes are whole bytes from the GiB the log printed (two decimals: within 5.4 MB). A term the log does not
print is derived from the engine's budget identity when the rest is known (provenance says "derived"), or
left null so the engine model's own figure stands.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from kvplan.calibrate.log import StartupLog
from kvplan.calibrate.vllm_log import graph_estimate
from kvplan.capacity.deployment import BoxProfile, Deployment
from kvplan.errors import InputError
from kvplan.planner.verdict import Verdict

PROFILE_VERSION = 1
_INT_FIELDS = ("total_memory_bytes", "tp", "pp", "non_torch_bytes", "cuda_graph_bytes", "max_num_batched_tokens",
               "max_num_seqs", "weights_bytes", "activation_peak_bytes", "sampler_state_bytes")
_STR_FIELDS = ("source", "engine", "engine_version", "vllm_engine", "gpu_name", "model")


def _term(v: Verdict, name: str) -> int | None:
    found = [t.bytes for t in v.account.terms if t.name == name]
    return found[0] if found else None


def resolved_setting(v: Verdict, key: str) -> Any:
    """A setting as the engine model resolved it (vLLM's report keeps them under "flags")."""
    detail = v.account.detail
    flags = detail.get("flags")
    if isinstance(flags, dict) and key in flags:
        return flags[key]
    return detail.get(key)


def _vllm_profile(log: StartupLog, d: Deployment, v: Verdict) -> tuple[dict[str, Any], dict[str, str]]:
    r = log.primary
    values: dict[str, Any] = {}
    why: dict[str, str] = {}

    def measured(field: str, key: str) -> int | None:
        got = r.get(key)
        if got is None:
            return None
        values[field] = got.as_int
        why[field] = f"measured: line {got.line} ({key.replace('_', ' ')})"
        return got.as_int

    total = measured("total_memory_bytes", "total")
    if total is None:
        total = values["total_memory_bytes"] = d.gpu.total_memory_bytes
        why["total_memory_bytes"] = f"catalog: {d.gpu.key} (the log prints no total)"
    weights = measured("weights_bytes", "weights")
    non_torch = measured("non_torch_bytes", "non_torch")
    consumed = r.get("consumed")
    # Model Runner V2's sampler state is persistent memory the consumed figure (0.27+) holds beside the weights;
    # a log that prints its non-torch memory apart (to 0.26) has a budget that does not count it.
    sampler = _term(v, "sampler_state") or 0
    if sampler and consumed is not None and non_torch is None:
        values["sampler_state_bytes"] = sampler
        why["sampler_state_bytes"] = f"modelled: Model Runner V2's, inside line {consumed.line}'s consumed memory"
    elif sampler and non_torch is not None:
        values["sampler_state_bytes"] = sampler = 0
        why["sampler_state_bytes"] = "none: the log prints its non-torch memory apart, a budget without it"
    # An MTP proposer's buffers sit inside the consumed figure too; kvplan models them (proposer_buffer_bytes).
    proposer = (_term(v, "draft_buffers") or 0) if consumed is not None and non_torch is None else 0
    modelled = (" - the sampler state" if sampler else "") + (" - the MTP proposer's buffers" if proposer else "")
    if non_torch is None and consumed is not None and weights is not None:
        non_torch = values["non_torch_bytes"] = consumed.as_int - weights - sampler - proposer
        why["non_torch_bytes"] = f"derived: line {consumed.line}, consumed memory - weights" + modelled
    elif non_torch is None and consumed is not None and _term(v, "weights") is not None:
        # No "Model loading took" line: the consumed memory still fixes weights + non-torch, so the non-torch
        # term takes what kvplan's weights leave of it (club-3090#1087: 15.03 GiB consumed, 14.49 modelled).
        non_torch = values["non_torch_bytes"] = consumed.as_int - (_term(v, "weights") or 0) - sampler - proposer
        why["non_torch_bytes"] = f"derived: line {consumed.line}, consumed memory - kvplan's weights" + modelled
    graphs = measured("cuda_graph_bytes", "cuda_graph_estimate")
    share = graph_estimate(log, total) if graphs is None and log.engine == "vllm" else None
    if share is not None:
        graphs = values["cuda_graph_bytes"] = share.as_int
        why["cuda_graph_bytes"] = f"derived: line {share.line}, the estimate as a share of the total"
    graphs = graphs or measured("cuda_graph_bytes", "cuda_graph_actual")
    activation = measured("activation_peak_bytes", "activation_peak")
    if activation is not None and consumed is not None and graphs and _term(v, "cuda_graphs") is not None:
        # The consumed-memory summary (0.26+) prints as "peak activation" all the budget takes beyond consumed
        # memory, the CUDA-graph estimate included: Qwen3-235B at tp 4 on 0.27.1, 85.51 - 56.89 - 0.76 = 27.86
        # GiB, the logged 27.85. The profile keeps the graphs as their own term, so the activation is the rest.
        activation = values["activation_peak_bytes"] = activation - graphs
        why["activation_peak_bytes"] += ", less the CUDA graphs (0.26+ prints them together)"
    available = r.get("available_kv")
    util = log.settings.utilization or resolved_setting(v, "gpu_memory_utilization")
    if activation is None and available is not None and weights is not None and util:
        # vLLM's budget: available = ceil(total x util) - weights - activation - non-torch [- graphs]; with every
        # other term known, the activation peak is what is left (the log does not print it).
        subtracted = (graphs or _term(v, "cuda_graphs") or 0) if _term(v, "cuda_graphs") is not None else 0
        if non_torch is None:
            non_torch = _term(v, "non_torch") or 0
            values["non_torch_bytes"] = non_torch
            why["non_torch_bytes"] = "modelled: kvplan's non-torch figure (the log prints none)"
        rest = math.ceil(total * float(util)) - weights - available.as_int - non_torch - subtracted - sampler
        if rest >= 0:
            values["activation_peak_bytes"] = rest
            why["activation_peak_bytes"] = (f"derived: line {available.line}, ceil(total x {util}) - weights - "
                                            "available KV - non-torch" + (" - CUDA graphs" if subtracted else ""))
    s = log.settings
    for field, setting, key in (("max_num_batched_tokens", s.max_num_batched_tokens, "max_num_batched_tokens"),
                                ("max_num_seqs", s.max_num_seqs, "max_num_seqs")):
        if setting is not None:
            values[field], why[field] = setting, "the log's setting"
        elif resolved_setting(v, key) is not None:
            values[field] = resolved_setting(v, key)
            why[field] = "kvplan's default for this deployment (not in the log)"
    return values, why


def _sglang_profile(log: StartupLog, d: Deployment) -> tuple[dict[str, Any], dict[str, str]]:
    r = log.primary
    values: dict[str, Any] = {"total_memory_bytes": d.gpu.total_memory_bytes}
    why = {"total_memory_bytes": f"catalog: {d.gpu.key} (SGLang prints no total)"}
    before, after, weights = r.get("free_before_load"), r.get("free_after_load"), r.get("weights")
    if weights is not None:
        values["weights_bytes"], why["weights_bytes"] = weights.as_int, f"measured: line {weights.line}"
    elif before is not None and after is not None:
        values["weights_bytes"] = before.as_int - after.as_int
        why["weights_bytes"] = f"derived: lines {before.line}, {after.line} (free before - free after loading)"
    free_before = before.as_int if before is not None else None
    if free_before is None and after is not None and weights is not None:
        free_before = after.as_int + weights.as_int
    if free_before is not None:
        # SGLang keeps its fraction of what is free before loading; what the box used before (context, NCCL,
        # any other process) is the GPU total minus that.
        values["non_torch_bytes"] = values["total_memory_bytes"] - free_before
        why["non_torch_bytes"] = "derived: GPU total - free memory before loading"
    graphs = r.get("cuda_graph_actual")
    if graphs is not None:
        values["cuda_graph_bytes"], why["cuda_graph_bytes"] = graphs.as_int, f"measured: line {graphs.line}"
    if log.settings.max_num_batched_tokens is not None:
        values["max_num_batched_tokens"] = log.settings.max_num_batched_tokens
        why["max_num_batched_tokens"] = "the log's chunked_prefill_size"
    return values, why


def build_profile(log: StartupLog, d: Deployment, v: Verdict) -> tuple[BoxProfile, dict[str, str]]:
    """The box's terms as `log` measured them for deployment `d` (planned as `v`), and where each came from."""
    if log.engine == "vllm":
        values, why = _vllm_profile(log, d, v)
    else:
        values, why = _sglang_profile(log, d)
    catalogued = d.gpu.vendor != "unknown"
    profile = BoxProfile(
        source=Path(log.source).name or log.source,
        engine=log.engine,
        engine_version=log.version,
        vllm_engine=resolved_setting(v, "engine") if log.engine == "vllm" else None,
        gpu_name=d.gpu.key if catalogued else log.settings.device_name,
        tp=d.parallelism.tp,
        pp=d.parallelism.pp,
        model=d.model.name,
        **values,
    )
    return profile, why


def profile_to_dict(profile: BoxProfile, provenance: dict[str, str]) -> dict[str, Any]:
    return {"kvplan_profile": PROFILE_VERSION, "profile": asdict(profile), "provenance": dict(provenance)}


def save_profile(path: str, profile: BoxProfile, provenance: dict[str, str]) -> None:
    try:
        Path(path).write_text(json.dumps(profile_to_dict(profile, provenance), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--save {path}: cannot write it ({exc.strerror or exc})") from None


def load_profile(path: str) -> BoxProfile:
    """The BoxProfile a `kvplan calibrate --save` file holds; an InputError naming the key that is wrong."""
    where = f"--profile {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: not a JSON profile ({exc}); write one with kvplan calibrate LOG --save") from None
    if not isinstance(data, dict) or "kvplan_profile" not in data:
        raise InputError(f"{where}: not a kvplan profile (no 'kvplan_profile' version); write one with "
                         "kvplan calibrate LOG --save")
    version = data["kvplan_profile"]
    if version != PROFILE_VERSION:
        raise InputError(f"{where}: profile version {version!r}; this kvplan reads version {PROFILE_VERSION}")
    body = data.get("profile")
    if not isinstance(body, dict):
        raise InputError(f"{where}: 'profile' must be an object")
    known = {f.name for f in fields(BoxProfile)}
    for key, value in body.items():
        if key not in known:
            raise InputError(f"{where}: unknown key profile.{key}; known: {', '.join(sorted(known))}")
        if key in _INT_FIELDS and value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                                         or not 0 <= value < 1 << 50):
            raise InputError(f"{where}: profile.{key} must be a whole number of bytes or null, got {value!r}")
        if key in _STR_FIELDS and value is not None and not isinstance(value, str):
            raise InputError(f"{where}: profile.{key} must be a string or null, got {value!r}")
    for key in ("source", "engine"):
        if not isinstance(body.get(key), str):
            raise InputError(f"{where}: profile.{key} is required")
    return BoxProfile(**body)
