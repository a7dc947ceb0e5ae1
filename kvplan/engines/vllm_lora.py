"""The GPU memory vLLM's LoRA slots take (--enable-lora, --max-loras, --max-lora-rank).

With LoRA on, vLLM wraps every linear layer, the embedding and the LM head at model load and gives each
wrapper zero-filled stacks for `max_loras` adapters of rank `max_lora_rank`, in the model dtype (vllm/lora/
layers.py create_lora_weights). They are allocated before "Model loading took X GiB" is measured, so vLLM
counts them as weights. Per slot, with r the rank, H the hidden size, I the MLP width, V the vocabulary:
  column-parallel (qkv, gate_up; one stack per packed slice): A [r x H] per slice, B [out / tp x r];
  row-parallel (o_proj, down_proj): A [r x in / tp], B [H x r];
  embedding: A [(V + extra) x r], B [H x r], plus [extra x H] added embeddings;
  LM head: A [r x H], B [V' x r] (V' = V + extra rounded up to 256 while the extra vocabulary exists), plus
  [extra x H] added rows.
`extra` is lora_extra_vocab_size (256 by default) up to 0.11; vLLM removed the extra vocabulary in 0.12
(vllm-project/vllm#28382, #28545). --fully-sharded-loras splits the column layers' A by tp as well.

Llama-3.2-3B, one slot of rank 64 on V0 0.8.5, fp16: 28 layers x 3,473,408 values + 18,415,616 in the
embedding and head = 115,671,040 x 2 B, plus 256 extra embedding rows x 3,072 x 2 B: 232,914,944 B = 0.217 GiB.
The Unsloth notebook log prints 6.25 GiB of weights against kvplan's 6.02 without slots (+0.227 GiB). The
routed experts of MoE layers (FusedMoEWithLoRA, 0.11+) are not counted.
"""

from __future__ import annotations

from kvplan.errors import FieldError
from kvplan.model.kinds import LayerKind
from kvplan.model.specs import ModelSpec
from kvplan.records import dataclass
from kvplan.units import cdiv

# vLLM's LoRAConfig.possible_max_ranks: --max-lora-rank must be one of these.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
EXTRA_VOCAB = 256  # lora_extra_vocab_size's default (up to 0.11)
EXTRA_VOCAB_PADDING = 256  # lora_vocab_padding_size: the LM head's rows with the extra vocabulary
# Layer kinds whose projections are the four standard ones (q/k/v packed, o, gate/up packed, down).
_STANDARD = (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW, LayerKind.CHUNKED_LOCAL)


@dataclass(frozen=True)
class LoraSlots:
    """vLLM's LoRA capacity: adapters resident on the GPU at once and their largest rank."""

    max_loras: int = 1
    max_lora_rank: int = 16
    fully_sharded: bool = False

    def validate(self) -> None:
        if not 1 <= self.max_loras <= 1024:
            raise FieldError("engine.max_loras", "must be from 1 to 1024", self.max_loras)
        if self.max_lora_rank not in LORA_RANKS:
            raise FieldError("engine.max_lora_rank", f"must be one of {', '.join(map(str, LORA_RANKS))}",
                             self.max_lora_rank)


def _layer_values(model: ModelSpec, i: int, r: int, tp: int, fully_sharded: bool) -> int:
    """One slot's A and B values in layer i on one rank."""
    g = model.geometry
    h = g.hidden_size
    r_a = cdiv(r, tp) if fully_sharded else r
    q = g.num_attention_heads * g.head_dims[i]
    kv = g.kv_heads[i] * g.head_dims[i]
    slices = 2 if g.v_from_k[i] else 3
    out = q + kv * (slices - 1)
    values = slices * r_a * h + r * cdiv(out, tp)  # qkv_proj
    values += r * cdiv(q, tp) + h * r  # o_proj
    dense = g.moe is None or i not in g.moe.layers
    if dense and g.intermediate_sizes:
        inter = g.intermediate_sizes[i]
        values += 2 * r_a * h + r * cdiv(2 * inter, tp)  # gate_up_proj
        values += r * cdiv(inter, tp) + h * r  # down_proj
    return values


def lora_slot_bytes(
    model: ModelSpec, slots: LoraSlots, *, layers: range, tp: int, elem: int, first: bool, last: bool,
    extra_vocab: int,
) -> int:
    """Bytes of `slots` on one rank of a pipeline stage holding `layers` (embedding on the first stage, LM head on
    the last), in the model dtype of `elem` bytes. Raises FieldError for layers other than standard attention."""
    g = model.geometry
    if g.mla is not None or g.mamba is not None or g.linear_attention is not None or any(
        g.layer_kinds[i] not in _STANDARD for i in layers
    ):
        raise FieldError("engine.max_loras", "LoRA slots are modelled for standard attention layers only, not "
                         "MLA, Mamba or linear attention; plan without LoRA and add --weights-bytes for the slots")
    r = slots.max_lora_rank
    h, vocab = g.hidden_size, g.vocab_size
    values = sum(_layer_values(model, i, r, tp, slots.fully_sharded) for i in layers)
    if first:
        values += (vocab + extra_vocab) * r + h * r + extra_vocab * h
    if last:
        rows = cdiv(vocab + extra_vocab, EXTRA_VOCAB_PADDING) * EXTRA_VOCAB_PADDING if extra_vocab else vocab
        values += r * h + rows * r + extra_vocab * h
    # The base embedding (and an untied head) also grow by the extra rows, once, whatever max_loras is.
    base_rows = extra_vocab * h * (first + (last and not g.tie_word_embeddings))
    return (slots.max_loras * values + base_rows) * elem
