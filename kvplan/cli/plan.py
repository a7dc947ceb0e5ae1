"""`kvplan plan`: from a workload to the deployments that hold it, cheapest first, with the line to launch each.

Thin: flags -> a Workload and a SearchSpace -> kvplan.planner.search -> a table, JSON, or a deployment file
(--emit). Each option also carries the `kvplan estimate` flags that replay it, for anyone who wants to see
its whole account.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvplan.cli import options as opt
from kvplan.cli.flags import FIELD_FLAGS, flag_error
from kvplan.cli.output import Output
from kvplan.errors import EXIT_DOES_NOT_FIT, EXIT_OK, FieldError, InputError
from kvplan.units import GiB

WIDTH = 80
SEARCH = "Search"

MaxModelLen = Annotated[
    str | None,
    typer.Option("--max-model-len", "--seq", help="Tokens per request as vLLM reads them (16k = 16,000, 16K = "
                 "16,384; default: the model's context).", rich_help_panel=opt.WORKLOAD),
]
Concurrency = Annotated[
    int, typer.Option("--concurrency", "-c", "--batch", help="Requests held at once.", rich_help_panel=opt.WORKLOAD)
]
Gpus = Annotated[
    str | None, typer.Option("--gpu", help="GPU types to consider, e.g. H100,H200 (default: the catalog).",
                             rich_help_panel=SEARCH),
]
MaxGpus = Annotated[int, typer.Option("--max-gpus", help="Most GPUs in all.", rich_help_panel=SEARCH)]
GpusPerNode = Annotated[
    int, typer.Option("--gpus-per-node", help="GPUs per node: tensor parallelism stays inside one.",
                      rich_help_panel=SEARCH),
]
Engine = Annotated[str, typer.Option("--engine", help="Serving engine: vllm, sglang, ...", rich_help_panel=SEARCH)]
KvDtypes = Annotated[
    str, typer.Option("--kv-cache-dtype", help="KV dtypes to try: auto,fp8 (fp8: the engine's 8-bit float).",
                      rich_help_panel=SEARCH),
]
Quantizations = Annotated[
    str | None, typer.Option("--quantization", help="Weight quantizations to try as well, e.g. fp8 or none,fp8.",
                             rich_help_panel=SEARCH),
]
Prices = Annotated[
    list[str] | None, typer.Option("--price", help="GPU=USD_PER_HOUR per GPU, repeatable: --price H100=2.49.",
                                   rich_help_panel=SEARCH),
]
NoBundledPrices = Annotated[
    bool, typer.Option("--no-bundled-prices", help="Rank by your --price figures only.", rich_help_panel=SEARCH)
]
Top = Annotated[int, typer.Option("--top", help="Options shown in the table (JSON has all).",
                                  rich_help_panel=opt.OUTPUT)]
Emit = Annotated[
    str | None, typer.Option("--emit", help="Write the option as k8s, compose, vllm-config or helm-values.",
                             rich_help_panel=opt.OUTPUT),
]
OptionNumber = Annotated[int, typer.Option("--option", help="Which option --emit writes (1: the best).",
                                           rich_help_panel=opt.OUTPUT)]
OutputFile = Annotated[
    str | None, typer.Option("--output", "-o", help="Write --emit to this file (default: stdout).",
                             rich_help_panel=opt.OUTPUT),
]


def plan_engines() -> tuple[str, ...]:
    """Registered engines kvplan can write a launch line for (a new engine appears once both exist)."""
    from kvplan.emit.commands import LAUNCHERS
    from kvplan.engines import ENGINE_NAMES

    return tuple(name for name in ENGINE_NAMES if name in LAUNCHERS)


def _quantizations(text: str | None) -> tuple[str | None, ...]:
    from kvplan.cli.lists import names

    if text is None:
        return (None,)
    return tuple(None if q.lower() in ("none", "auto") else q for q in names(text, "--quantization"))


def estimate_args(option: Any, model: str, lengths: str | None) -> list[str]:
    """The `kvplan estimate` flags that plan this option again (its verdict, replicas included)."""
    d = option.deployment
    p, w = d.parallelism, d.workload
    words = ["kvplan", "estimate", model, "--gpu", d.gpu.key, "--num-gpus", str(option.verdict.total_gpus),
             FIELD_FLAGS["workload.max_model_len"], str(d.max_model_len), "--batch", str(w.concurrency),
             "--engine", d.engine.engine]
    for field, value, default in (("parallelism.tp", p.tp, 1), ("parallelism.pp", p.pp, 1),
                                  ("parallelism.dp", p.dp, 1), ("parallelism.ep_size", p.ep_size, None),
                                  ("kv_cache_dtype", d.kv_cache_dtype, "auto"),
                                  ("weights.quantization", d.weights.quantization, None),
                                  ("workload.shared_prefix_tokens", w.shared_prefix_tokens, 0),
                                  ("workload.prefix_hit_rate", w.prefix_hit_rate, 1.0),
                                  ("engine.kv_cache_memory_bytes", getattr(d.engine, "kv_cache_memory_bytes", None),
                                   None)):
        if value != default:
            words += [FIELD_FLAGS[field], str(value)]
    if p.expert_parallel:
        words.append("--enable-expert-parallel")
    if p.dp_attention:
        words.append("--enable-dp-attention")
    if lengths is not None:
        words += ["--lengths", lengths]
    elif w.mix is not None:
        words += ["--input-len", str(round(w.mix.mean_input_tokens)),
                  "--output-len", str(round(w.mix.mean_output_tokens))]
    return words


def shell_lines(argv: tuple[str, ...] | list[str], width: int = WIDTH, indent: int = 4) -> list[str]:
    """A command as shell lines of at most `width` columns, continued with backslashes, a flag kept with its
    value, so it pastes whole and no name or number is cut."""
    words = [shlex.quote(w) for w in argv]
    units: list[str] = []
    for word in words:
        if units and not word.startswith("-") and units[-1].startswith("--") and " " not in units[-1]:
            units[-1] += " " + word
        else:
            units.append(word)
    lines: list[str] = []
    current = " " * indent
    for unit in units:
        trial = unit if current.strip() == "" else current + " " + unit
        if current.strip() == "":
            current = " " * indent + unit
        elif len(trial) + 2 <= width:
            current = trial
        else:
            lines.append(current + " \\")
            current = " " * (indent + 2) + unit
    lines.append(current)
    return lines


def _shape(v: Any) -> str:
    p = v.deployment.parallelism
    shape = f"{p.tp}/{p.pp}"
    return shape + (f"/{p.dp}" if p.dp > 1 else "")


def _money(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def option_to_dict(i: int, option: Any, model: str, lengths: str | None) -> dict[str, Any]:
    from kvplan.emit.commands import launch
    from kvplan.planner.serialize import verdict_to_dict

    v = option.verdict
    d, p = v.deployment, v.deployment.parallelism
    line = launch(d, model)
    price = option.price
    return {
        "rank": i,
        "gpu": d.gpu.key,
        "num_gpus": v.total_gpus,
        "instances": d.instances,
        "gpus_per_instance": v.gpus_per_instance,
        "tensor_parallel_size": p.tp,
        "pipeline_parallel_size": p.pp,
        "data_parallel_size": p.dp,
        "expert_parallel": p.expert_parallel or p.ep_size is not None,
        "dp_attention": p.dp_attention,
        "kv_cache_dtype": d.kv_cache_dtype,
        "quantization": d.weights.quantization,
        "cost_per_hour": None if option.cost_per_hour is None else round(option.cost_per_hour, 4),
        "cost_per_million_kv_tokens_per_hour": (None if option.cost_per_million_kv_tokens is None
                                                else round(option.cost_per_million_kv_tokens, 4)),
        "price": None if price is None else {"usd_per_gpu_hour": price.usd_per_hour, "source": price.source,
                                             "date": price.date, "provider": price.provider},
        "max_concurrency": round(v.max_concurrency, 4),
        "max_requests": v.max_requests,
        "workload_concurrency": None if v.workload is None else v.workload.requests,
        "kv_tokens": option.kv_tokens,
        "kv_budget_bytes": v.kv_budget_bytes,
        "headroom_bytes": v.headroom_bytes,
        "headroom_share": round(option.headroom_share, 4),
        "longest_context_tokens": v.longest_context_tokens,
        "command": line.shell,
        "argv": list(line.argv),
        "command_notes": list(line.notes),
        "replay": shlex.join(estimate_args(option, model, lengths)),
        "verdict": verdict_to_dict(v),
    }


def _render(result: Any, model_name: str, model: str, workload: Any, engine_label: str, top: int,
            console: Console) -> None:
    from kvplan.emit.commands import launch

    stats = result.stats
    options = result.options
    noun = "request" if workload.concurrency == 1 else "requests"
    load = f"{workload.concurrency:,} {noun} of {options[0].deployment.max_model_len:,} tokens" if options else ""
    if not options:
        console.print(Text("NO OPTION", style="bold red").append(
            f": no GPU type, shape and KV dtype searched holds the workload on the GPUs allowed "
            f"({stats.planned:,} candidates planned). Raise --max-gpus, shorten --max-model-len or lower "
            "--concurrency."))
        return
    best = options[0]
    head = Text("PLAN", style="bold green")
    cost = f" for ${best.cost_per_hour:,.2f}/h" if best.cost_per_hour is not None else ""
    head.append(f" for {model_name} with {engine_label}: {load}. Best: {best.verdict.total_gpus} x "
                f"{best.deployment.gpu.key}{cost}, up to {best.verdict.max_requests:,} at once.")
    console.print(head)
    console.print(Text(f"{len(options):,} options, cheapest first ({stats.planned:,} candidates planned, "
                       f"{stats.pruned_weights + stats.pruned_gpus:,} skipped unplanned). tp/pp(/dp): one "
                       "instance; rep: replicas; headroom: KV left per GPU; $/h: all GPUs."))
    t = Table(box=None, pad_edge=False)
    for col, right in (("#", True), ("GPU", False), ("GPUs", True), ("tp/pp", False), ("rep", True),
                       ("KV", False), ("headroom", True), ("max req", True), ("$/h", True)):
        t.add_column(col, justify="right" if right else "left", no_wrap=True)
    for i, option in enumerate(options[:top], start=1):
        v = option.verdict
        headroom = "-" if v.headroom_bytes is None else (
            f"{v.headroom_bytes / GiB:,.2f} GiB {option.headroom_share:.0%}")
        t.add_row(str(i), option.deployment.gpu.key, str(v.total_gpus), _shape(v), str(option.deployment.instances),
                  option.deployment.kv_cache_dtype, headroom, f"{v.max_requests:,}", _money(option.cost_per_hour))
    console.print(t)
    for i, option in enumerate(options[:top], start=1):
        v = option.verdict
        console.print()
        facts = [f"longest context {v.longest_context_tokens:,} tokens"] if v.longest_context_tokens else []
        if v.workload is not None:
            facts.append(f"{v.workload.requests:,} real requests at once")
        if option.cost_per_million_kv_tokens is not None:
            facts.append(f"${option.cost_per_million_kv_tokens:,.2f}/h per million KV tokens")
        console.print(Text(f"{i}. " + "; ".join(facts) if facts else f"{i}."))
        line = launch(option.deployment, model)
        for text in shell_lines(line.argv):
            console.print(Text(text))
        for note in line.notes:
            console.print(Text(f"    note: {note}"))
    if len(options) > top:
        console.print()
        more = len(options) - top
        console.print(Text(f"{more:,} more option{'s' if more > 1 else ''}: --top {len(options)}, or --json."))
    console.print()
    if result.unpriced:
        console.print(Text(f"No price for {', '.join(result.unpriced)}: ranked after the priced ones; give "
                           "--price GPU=USD_PER_HOUR."))
    priced = {o.price.source: o.price.date for o in options if o.price is not None and o.price.date}
    if priced:
        console.print(Text(f"Prices: public list prices of {', '.join(sorted(set(priced.values())))}; each "
                           "option's source is in --json; all in kvplan/hardware/prices.json."))
    if workload.mix is not None:
        console.print(Text("real: requests of the given lengths resident at once (kvplan's figure); vLLM prints "
                           "the max-model-len one."))
    for note in result.notes:
        console.print(Text(f"note: {note}"))


def plan_command(
    model: opt.Model,
    max_model_len: MaxModelLen = None,
    concurrency: Concurrency = 1,
    shared_prefix: opt.SharedPrefix = 0,
    prefix_hit_rate: opt.PrefixHitRate = 1.0,
    input_len: opt.InputLen = None,
    output_len: opt.OutputLen = None,
    lengths: opt.Lengths = None,
    gpu: Gpus = None,
    max_gpus: MaxGpus = 8,
    gpus_per_node: GpusPerNode = 8,
    engine: Engine = "vllm",
    kv_cache_dtype: KvDtypes = "auto,fp8",
    quantization: Quantizations = None,
    price: Prices = None,
    no_bundled_prices: NoBundledPrices = False,
    revision: opt.Revision = None,
    token: opt.Token = None,
    offline: opt.Offline = False,
    top: Top = 5,
    emit: Emit = None,
    option: OptionNumber = 1,
    output: OutputFile = None,
    json_out: opt.Json = False,
) -> None:
    """Find the deployments that hold a workload, cheapest first, and the command that launches each.

    Example: kvplan plan Qwen/Qwen3-32B --max-model-len 16k --concurrency 50 --gpu H100,H200
    """
    from kvplan.capacity.deployment import Workload
    from kvplan.cli.lengths import request_mix
    from kvplan.cli.lists import human_int, names
    from kvplan.emit.commands import launch
    from kvplan.emit.manifests import EMITTERS
    from kvplan.engines import get_engine
    from kvplan.hardware.gpus import all_gpus, find_gpu
    from kvplan.hardware.prices import price_table
    from kvplan.planner.search import SearchSpace, search
    from kvplan.sources.resolve import resolve_model

    if engine not in plan_engines():
        raise InputError(f"--engine {engine}: plan launches one of {', '.join(plan_engines())}")
    if emit is not None and emit not in EMITTERS:
        raise InputError(f"--emit {emit}: write one of {', '.join(EMITTERS)}")
    if emit is not None and json_out and output is None:
        raise InputError("--emit without --output writes the file to stdout; --json cannot share it: add --output")
    if output is not None and emit is None:
        raise InputError("--output names the file --emit writes; add --emit k8s (or compose, vllm-config, "
                         "helm-values)")
    if top < 1:
        raise InputError(f"--top {top}: show at least 1 option")
    seq = None if max_model_len is None else human_int(max_model_len, "--max-model-len")
    gpus = tuple(find_gpu(n) for n in names(gpu, "--gpu")) or all_gpus()
    prices = price_table(price or [], bundled=not no_bundled_prices)
    resolved = resolve_model(model, revision=revision, token=token, offline=offline)
    out = Output(json_mode=json_out and emit is None)
    for notice in resolved.notices:
        out.notice(notice)
    spec = resolved.model
    if seq is None and spec.max_position_embeddings is None:
        raise InputError(f"{spec.name} states no max context; give --max-model-len")
    try:
        workload = Workload(max_model_len=seq, concurrency=concurrency, shared_prefix_tokens=shared_prefix,
                            prefix_hit_rate=prefix_hit_rate, mix=request_mix(input_len, output_len, lengths))
        workload.validate()
        space = SearchSpace(gpus=gpus, engine=engine, kv_cache_dtypes=names(kv_cache_dtype, "--kv-cache-dtype"),
                            quantizations=_quantizations(quantization), max_gpus=max_gpus,
                            gpus_per_node=gpus_per_node)
        result = search(spec, workload, space, prices=prices)
    except FieldError as exc:
        raise _plan_flag_error(exc) from None
    if seq is None and spec.max_position_embeddings:
        out.notice(f"no request length given: using the model's max context, {spec.max_position_embeddings:,} "
                   "tokens")
    if emit is not None:
        if not 1 <= option <= len(result.options):
            raise InputError(f"--option {option}: the plan has {len(result.options)} options"
                             if result.options else "--emit: no option holds the workload; nothing to write")
        chosen = result.options[option - 1]
        text = EMITTERS[emit](chosen.verdict, launch(chosen.deployment, model), model, option)
        if output is None:
            out.raw(text)
            raise typer.Exit(EXIT_OK)
        Path(output).expanduser().write_text(text, encoding="utf-8")
        out.notice(f"option {option} written to {output} ({emit})")
    label = get_engine(engine).label
    doc = {
        "schema_version": 2,
        "model": {"name": spec.name, "source": spec.source},
        "workload": {"max_model_len": seq or spec.max_position_embeddings, "concurrency": concurrency,
                     "shared_prefix_tokens": shared_prefix, "prefix_hit_rate": prefix_hit_rate,
                     "mix": None if workload.mix is None else {
                         "mean_input_tokens": round(workload.mix.mean_input_tokens, 2),
                         "mean_output_tokens": round(workload.mix.mean_output_tokens, 2),
                         "requests": workload.mix.requests, "source": workload.mix.source}},
        "search": {"engine": engine, "gpus": [g.key for g in gpus], "kv_cache_dtypes": list(space.kv_cache_dtypes),
                   "quantizations": list(space.quantizations), "max_gpus": max_gpus, "gpus_per_node": gpus_per_node,
                   "candidates_planned": result.stats.planned, "skipped_weights": result.stats.pruned_weights,
                   "skipped_more_gpus": result.stats.pruned_gpus, "refused": result.stats.refused},
        "options": [option_to_dict(i, o, model, lengths) for i, o in enumerate(result.options, start=1)],
        "unpriced_gpus": list(result.unpriced),
        "notes": list(result.notes),
    }
    out.result(doc, lambda console: _render(result, spec.name, model, workload, label, top, console))
    raise typer.Exit(EXIT_OK if result.options else EXIT_DOES_NOT_FIT)


def _plan_flag_error(exc: FieldError) -> InputError:
    """A core FieldError in plan's flag words (--concurrency where estimate says --batch)."""
    names = {"workload.concurrency": "--concurrency", "search.max_gpus": "--max-gpus",
             "search.gpus_per_node": "--gpus-per-node"}
    if exc.field in names:
        return InputError(exc.phrased(names[exc.field]))
    return flag_error(exc)
