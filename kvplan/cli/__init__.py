"""The `kvplan` command line: thin commands that parse flags, call the library, and hand data to output."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from kvplan import __version__
from kvplan.cli.output import Output, report_error
from kvplan.errors import EXIT_DOES_NOT_FIT, EXIT_OK, KvplanError
from kvplan.units import parse_size

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="KV-cache capacity planner for LLM serving: size it, fit it, prove it.",
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(func: F) -> F:
    """Run a command; expected failures become `Error: ...` on stderr with the documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure gets one line, never a traceback
            raise typer.Exit(report_error(exc)) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvplan {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """KV-cache capacity planner for LLM serving."""


def _size(value: str | None, flag: str) -> int | None:
    return None if value is None else parse_size(value, flag)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (same data as the table).")]


@app.command()
@handle_errors
def estimate(
    model: Annotated[str, typer.Argument(help="Hub repo id, local config.json / model dir, or a library name.")],
    seq: Annotated[
        int | None,
        typer.Option("--seq", "--max-model-len", help="Tokens per request (default: the model's max context)."),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", "-b", help="Concurrent requests.")] = 1,
    kv_cache_dtype: Annotated[
        str, typer.Option("--kv-cache-dtype", help="auto, fp32, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2, int8, int4, nvfp4.")
    ] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="Weight dtype: auto (the config's, float32 served as bf16), bf16, fp16, fp32.")] = "auto",
    block_size: Annotated[
        int | None, typer.Option("--block-size", help="Paged-KV block size in tokens (vLLM default 16).")
    ] = None,
    tp: Annotated[int, typer.Option("--tp", "--tensor-parallel-size", help="Tensor-parallel GPUs.")] = 1,
    pp: Annotated[int, typer.Option("--pp", "--pipeline-parallel-size", help="Pipeline stages.")] = 1,
    shared_prefix: Annotated[
        int, typer.Option("--shared-prefix", help="Prompt-prefix tokens common to the whole batch (stored once).")
    ] = 0,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU type, e.g. H100, A100-80GB, L4 (see `kvplan gpus`).")] = None,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="Memory of another card, e.g. 48GiB.")] = None,
    num_gpus: Annotated[int | None, typer.Option("--num-gpus", help="GPUs in total (default tp x pp; more = replicas).")] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option("--gpu-memory-utilization", help="Fraction of GPU memory vLLM may use (default 0.92; 0.9 with --vllm-version 0.19)."),
    ] = None,
    overhead: Annotated[
        str | None,
        typer.Option(
            "--overhead",
            help="--engine generic/transformers: activations + runtime per GPU (default 2 GiB, +2 GiB multi-GPU); "
            "vLLM and SGLang model their own.",
        ),
    ] = None,
    weights_bytes: Annotated[
        str | None, typer.Option("--weights-bytes", help="The checkpoint's size, e.g. 15GiB (replaces the config-based figure).")
    ] = None,
    weights_from_hub: Annotated[
        bool, typer.Option("--weights-from-hub", help="Read the checkpoint's exact size from its safetensors headers on the Hub.")
    ] = False,
    quantization: Annotated[str | None, typer.Option("--quantization", help="Runtime weight quantization (fp8).")] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub revision (branch, tag or commit).")] = None,
    token: Annotated[str | None, typer.Option("--token", help="Hub token (default: HF_TOKEN).")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Never touch the network: bundled library and cache only.")] = False,
    engine: Annotated[
        str, typer.Option("--engine", help="Whose accounting: vllm (default), sglang, transformers, or generic (fixed overhead).")
    ] = "vllm",
    vllm_version: Annotated[
        str, typer.Option("--vllm-version", help="vLLM behaviour: current (util 0.92, CUDA graphs counted) or 0.19.")
    ] = "current",
    max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs", help="vLLM: requests per step (default 1024 on >=70 GiB non-A100 GPUs, else 256).")] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option("--max-num-batched-tokens", help="vLLM: tokens per step (default 8192 on >=70 GiB non-A100 GPUs, else 2048).")
    ] = None,
    enable_prefix_caching: Annotated[
        bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="vLLM prefix caching (default on).")
    ] = True,
    kv_cache_memory: Annotated[
        str | None, typer.Option("--kv-cache-memory-bytes", "--kv-cache-memory", help="vLLM: fix the KV memory per GPU, e.g. 40GiB (skips the budget model).")
    ] = None,
    mem_fraction_static: Annotated[
        float | None, typer.Option("--mem-fraction-static", help="SGLang: fraction of the memory free before loading (default 0.9).")
    ] = None,
    page_size: Annotated[int, typer.Option("--page-size", help="SGLang: tokens per KV page (default 1).")] = 1,
    hf_cache: Annotated[str, typer.Option("--hf-cache", help="Transformers: dynamic or static cache.")] = "dynamic",
    json_out: JsonOpt = False,
) -> None:
    """Size the KV cache for MODEL and fit it to a GPU, as the serving engine would (vLLM by default).

    Example: kvplan estimate meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 --gpu H100 --gpu-memory-utilization 0.95
    """
    from kvplan.api import estimate as run_estimate

    out = Output(json_mode=json_out)
    result = run_estimate(
        model,
        seq_tokens=seq,
        batch=batch,
        kv_cache_dtype=kv_cache_dtype,
        dtype=None if dtype == "auto" else dtype,
        block_size=block_size,
        tp=tp,
        pp=pp,
        shared_prefix_tokens=shared_prefix,
        gpu=gpu,
        gpu_mem_bytes=_size(gpu_mem, "--gpu-mem"),
        num_gpus=num_gpus,
        gpu_memory_utilization=gpu_memory_utilization,
        overhead_bytes=_size(overhead, "--overhead"),
        weights_bytes=_size(weights_bytes, "--weights-bytes"),
        weights_from_hub=weights_from_hub,
        quantization=quantization,
        revision=revision,
        token=token,
        offline=offline,
        engine=engine,
        vllm_version=vllm_version,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching,
        kv_cache_memory_bytes=_size(kv_cache_memory, "--kv-cache-memory-bytes"),
        mem_fraction_static=mem_fraction_static,
        page_size=page_size,
        hf_cache=hf_cache,
    )
    for notice in result.notices:
        out.notice(notice)
    out.result(result.data, result.render)
    raise typer.Exit(EXIT_OK if result.fits in (True, None) else EXIT_DOES_NOT_FIT)


@app.command()
@handle_errors
def gpus(json_out: JsonOpt = False) -> None:
    """List the GPU catalog with the memory CUDA reports. Example: kvplan gpus --json"""
    from kvplan.cli.render import gpus_to_dict, render_gpus
    from kvplan.hardware.gpus import all_gpus

    catalog = all_gpus()
    Output(json_mode=json_out).result(gpus_to_dict(catalog), lambda console: render_gpus(catalog, console))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KvplanError as exc:  # raised outside a command (e.g. while parsing options)
        raise SystemExit(report_error(exc)) from None


# Commands that live in their own packages (their modules import nothing heavy at load time).
from kvplan.cli.check import check as _check  # noqa: E402
from kvplan.cli.models import models_command as _models  # noqa: E402
from kvplan.cli.verify import verify_command as _verify  # noqa: E402

app.command("check")(handle_errors(_check))
app.command("models")(handle_errors(_models))
app.command("verify")(handle_errors(_verify))
