"""DeepSeek-V3.2's sparse attention (DSA) on vLLM (engine-rules.md 1.25), read in the 0.11-0.33 sdists.

Each MLA layer keeps, beside its latent, the lightning indexer's key for every token: 128 fp8 values and one
float32 scale, 132 B, whatever the cache dtype (`DeepseekV32IndexerCache`). Both specs are one head, so every
TP rank holds them whole, in 64-token blocks, and vLLM puts all 2 x 61 of them in one group whose page is the
sum of theirs (`UniformTypeKVCacheSpecs`): nothing is padded. The latent is stored as the sparse backend takes
it: fp8_ds_mla (512 fp8 values, 4 float32 scales, 64 bf16 rotary values: 656 B) under FlashMLA-sparse, plain
fp8 (576 B) under FlashInfer-sparse on SM100 from 0.18, or the model dtype (1,152 B in bf16). DeepSeek-V3.2 at
tp 8 with fp8: 64 x (656 + 132) x 61 = 3,076,352 B a block.
"""

from __future__ import annotations

from kvplan.engines.vllm_versions import VllmRules
from kvplan.errors import FieldError
from kvplan.hardware.gpus import COMPUTE_CAPABILITY
from kvplan.model.dtypes import weight_dtype_bytes
from kvplan.model.specs import ModelSpec
from kvplan.units import BF16_BYTES, FP32_BYTES, INT32_BYTES, cdiv

# The indexer's kernels take only 64-token blocks (DeepseekV32IndexerBackend): the platform forces 64 over any
# --block-size to 0.17 (CudaPlatform.check_and_update_config); from 0.18 it is the indexer backend's preference,
# and vllm_dsv4.sparse_mla_refusal refuses another given size.
BLOCK_TOKENS = 64
INDEX_QUANT_BLOCK = 128  # fp8 values per float32 scale in the indexer key and in fp8_ds_mla
FLASHINFER_SMALL_HEADS = 16  # SM100 puts FlashInfer-sparse first at this many heads a rank or fewer (0.17+)


def index_key_bytes(width: int) -> int:
    """One lightning-indexer key as vLLM and SGLang store it, DeepSeek-V3.2's and V4's alike: fp8 values and a
    float32 scale per 128 (DeepseekV32IndexerCache, DeepseekV4Indexer, NSATokenToKVPool): 128 + 4 = 132 B."""
    return width + width // INDEX_QUANT_BLOCK * FP32_BYTES


def uses_dsa(model: ModelSpec) -> bool:
    mla = model.geometry.mla
    return mla is not None and mla.index_head_dim > 0


def dsa_check(rules: VllmRules, *, gpu_key: str, vendor: str, version: str) -> None:
    """The release must have DeepSeek-V3.2 (0.11+) and the GPU a sparse MLA backend (sparse_mla_gpu)."""
    if not rules.dsa:
        raise FieldError("engine.version", f"vLLM {version} does not have DeepSeek-V3.2's sparse attention "
                         "(first in 0.11.0)", version)
    sparse_mla_gpu(rules, gpu_key=gpu_key, vendor=vendor, version=version, model="DeepSeek-V3.2")


def sparse_mla_gpu(rules: VllmRules, *, gpu_key: str, vendor: str, version: str, model: str) -> None:
    """vLLM's sparse MLA kernels (DeepSeek-V3.2, V4): FlashMLA-sparse, built for Hopper and data-center
    Blackwell (SM90, SM10x); FlashInfer's SM120 kernels (RTX PRO 6000, RTX 5090) from 0.24, in the same cache
    layouts. ROCm is not modelled (V3.2 raises "Sparse Attention is not supported" there). A card of unknown
    architecture (--gpu-mem) is taken as able."""
    capability = COMPUTE_CAPABILITY.get(gpu_key)
    if vendor == "amd":
        raise FieldError("gpu", f"kvplan models {model}'s sparse attention on vLLM's CUDA path only, not ROCm",
                         gpu_key)
    if capability is None or capability[0] in (9, 10) or (capability[0] == 12 and rules.sparse_mla_sm120):
        return
    raise FieldError("gpu", f"vLLM {version} runs {model}'s sparse attention on Hopper and data-center Blackwell "
                     f"GPUs (SM90, SM100; SM120 from 0.24), not SM{capability[0]}{capability[1]}", gpu_key)


def dsa_storage(model: ModelSpec, rules: VllmRules, *, kv_name: str, dtype: str, gpu_key: str, tp: int) -> str:
    """How vLLM stores the latent: "fp8_ds_mla", plain "fp8", or the dtype of a 16-bit cache.

    `auto` is the model dtype from 0.11.1 (0.11.0 forces fp8_ds_mla; so does SM120 from 0.24); an fp8 cache is
    fp8_ds_mla under FlashMLA-sparse, plain fp8 under FlashInfer-sparse, which SM100 picks for fp8 from 0.19
    and, on 0.18, where a rank has 16 heads or fewer (DeepSeek-V3.2 at tp 8: 128 / 8 = 16).
    """
    capability = COMPUTE_CAPABILITY.get(gpu_key)
    major = capability[0] if capability else None
    if major == 12 or (kv_name == "auto" and rules.dsa_auto_fp8):
        return "fp8_ds_mla"
    if kv_name.startswith("fp8"):
        heads = cdiv(model.num_attention_heads, tp)
        flashinfer = major == 10 and kv_name != "fp8_ds_mla" and (
            rules.dsa_fp8_flashinfer == "always"
            or (rules.dsa_fp8_flashinfer == "small_heads" and heads <= FLASHINFER_SMALL_HEADS))
        return "fp8" if flashinfer else "fp8_ds_mla"
    return dtype if kv_name == "auto" else kv_name


def dsa_token_bytes(model: ModelSpec, storage: str) -> int:
    """Bytes one token adds to one layer on a rank: the latent as `storage` keeps it (fp8_ds_mla: 512 fp8
    values, a float32 scale per 128, 64 bf16 rotary values = 656 B), and the indexer key (128 + 4 = 132 B).
    DeepSeek-V3.2 in bf16: 1,152 + 132 = 1,284 B."""
    mla = model.geometry.mla
    assert mla is not None  # called where uses_dsa(model)
    latent = mla.kv_lora_rank + mla.qk_rope_head_dim
    if storage == "fp8_ds_mla":
        stored = mla.kv_lora_rank + mla.kv_lora_rank // INDEX_QUANT_BLOCK * FP32_BYTES \
            + mla.qk_rope_head_dim * BF16_BYTES
    elif storage == "fp8":
        stored = latent
    else:
        stored = latent * weight_dtype_bytes(storage)
    return stored + index_key_bytes(mla.index_head_dim)


def dsa_buffer_bytes(model: ModelSpec, rules: VllmRules, *, max_num_batched_tokens: int, max_model_len: int,
                     max_num_seqs: int, decode_tokens: int, layers: int) -> int:
    """What vLLM allocates for the indexer when it builds the model and its backends, measured with the
    weights: the shared top-k indices, int32 [step tokens, index_topk] (8,192 x 2,048 x 4 B = 67,108,864 B);
    from 0.17 the indexer builder's expanded block table, int32 [step tokens, cdiv(max_model_len, 64)]; from
    0.30 every layer's index group, (R + 1) x (index_topk + 1) int32 with R = min(step tokens, sequences x
    decode tokens) (v1/attention/backends/mla/index_group.py), for each of the rank's `layers`."""
    mla = model.geometry.mla
    assert mla is not None  # called where uses_dsa(model)
    topk = max_num_batched_tokens * mla.index_topk * INT32_BYTES
    table = max_num_batched_tokens * cdiv(max_model_len, BLOCK_TOKENS) * INT32_BYTES if rules.dsa_block_table else 0
    rows = min(max_num_batched_tokens, max_num_seqs * decode_tokens) + 1
    groups = layers * rows * (mla.index_topk + 1) * INT32_BYTES if rules.dsa_index_groups else 0
    return topk + table + groups


def dsa_note(model: ModelSpec, storage: str) -> str:
    """The plan's note on what one token costs a DeepSeek-V3.2 layer on vLLM."""
    per_token = dsa_token_bytes(model, storage)
    mla = model.geometry.mla
    assert mla is not None  # called where uses_dsa(model)
    index = index_key_bytes(mla.index_head_dim)
    return (f"sparse attention: each layer keeps the indexer's key ({index} B, fp8 with its scale) beside the "
            f"latent stored as {storage} ({per_token - index:,} B): {per_token:,} B a token, the same on every "
            "TP rank")
