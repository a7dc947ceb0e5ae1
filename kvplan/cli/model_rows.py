"""The bundled library as rows (one per model, with its KV and weight figures) and their 80-column rendering."""

from __future__ import annotations

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from kvplan.capacity.weights import estimate_weights
from kvplan.errors import KvplanError
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.model.parse import parse_config
from kvplan.model.specs import ModelSpec
from kvplan.records import dataclass
from kvplan.sources import library
from kvplan.units import fmt_bytes


@dataclass(frozen=True)
class ModelRow:
    name: str
    family: str
    model_type: str
    kinds: dict[str, int]  # layer kind -> number of layers
    layers: int
    kv_heads: list[int]  # distinct KV head counts of the attention layers (several where layers differ)
    dtype: str  # the dtype the model is served in ('auto'): KV and unquantized weights use it
    kv_bytes_per_token: int  # all layers, one token, at `dtype`, tp=1
    state_bytes_per_request: int  # constant Mamba / linear-attention state, at tp=1
    params: int
    weight_bytes: int  # the checkpoint as loaded (quantized where the config says so)
    quantization: str | None
    max_context_tokens: int | None


def model_row(name: str, model: ModelSpec) -> ModelRow:
    """One table row: Llama-3.1-8B -> 32 full-attention layers, 8 KV heads, 131,072 B/token in bf16."""
    dtype = serving_dtype(model.config_dtype)
    kv = resolve_kv_dtype("auto", dtype)
    heads = sorted({n for spec in model.layers if (n := getattr(spec, "num_kv_heads", None))})
    return ModelRow(
        name=name,
        family=model.family,
        model_type=model.model_type,
        kinds={str(kind): n for kind, n in model.layer_kinds().items()},
        layers=model.num_layers,
        kv_heads=heads,
        dtype=dtype,
        kv_bytes_per_token=sum(spec.kv_bytes_per_token(kv) for spec in model.layers),
        state_bytes_per_request=sum(spec.state_bytes() for spec in model.layers),
        params=model.num_params,
        weight_bytes=estimate_weights(model, dtype=dtype).total_bytes,
        quantization=model.quant.method if model.quant else None,
        max_context_tokens=model.max_position_embeddings,
    )


def library_rows(
    name: str | None = None, family: str | None = None, kind: str | None = None
) -> tuple[list[ModelRow], list[str]]:
    """Rows for every library model matching the filters, and a message per config that failed to parse."""
    rows: list[ModelRow] = []
    failures: list[str] = []
    for entry in library.entries():
        if name and name.lower() not in entry.repo_id.lower():
            continue
        try:
            model = parse_config(
                entry.read_config(),
                name=entry.repo_id,
                source=f"library:{entry.filename}",
                hf_quant_config=entry.read_hf_quant_config(),
            )
        except KvplanError as exc:
            failures.append(f"{entry.repo_id} skipped: {exc.message}")
            continue
        if family and family.lower() != model.family.lower():
            continue
        if kind and not any(k == kind or k.startswith(kind) for k in model.layer_kinds()):
            continue
        rows.append(model_row(entry.repo_id, model))
    return rows, failures


def render_models(rows: list[ModelRow], console: Console) -> None:
    """Each model on its own line, its figures indented below: long ids are never cut at 80 columns."""
    console.print(Text(f"Model library: {len(rows)} model{'' if len(rows) == 1 else 's'} (KV and weights at the "
                       "served dtype, tp 1)", style="bold"))
    for r in rows:
        kinds = ", ".join(f"{n} {k}" for k, n in r.kinds.items())
        heads = "" if not r.kv_heads else f"; {'/'.join(str(h) for h in r.kv_heads)} KV heads"
        weights = fmt_bytes(r.weight_bytes) + (f" ({r.quantization})" if r.quantization else "")
        state = f", + {fmt_bytes(r.state_bytes_per_request)} state/request" if r.state_bytes_per_request else ""
        context = f"{r.max_context_tokens:,}" if r.max_context_tokens else "-"
        console.print(Text(r.name, style="bold"))
        console.print(Padding(Text(f"{r.family}, {r.layers} layers: {kinds}{heads}"), (0, 0, 0, 4)))
        console.print(Padding(Text(
            f"KV {r.kv_bytes_per_token:,} B/token{state}; weights {weights}, {r.params / 1e9:,.2f}B params; "
            f"context {context}"), (0, 0, 0, 4)))
