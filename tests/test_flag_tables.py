"""The engines' flag tables: generated from their own argument definitions (scripts/gen_flag_tables.py)."""

from __future__ import annotations

import ast
import importlib.util
import json
import textwrap

from kvplan.check.flag_tables import SGLANG, VLLM, engine_versions
from kvplan.check.flags import parse_args
from tests.conftest import REPO

DATA = json.loads((REPO / "kvplan" / "check" / "engine_flags.json").read_text())


def _script():
    spec = importlib.util.spec_from_file_location("gen_flag_tables", REPO / "scripts" / "gen_flag_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_is_stamped_with_the_engine_versions():
    assert DATA["generated_by"].startswith("scripts/gen_flag_tables.py")
    assert engine_versions("vllm") == ("0.6.6.post1", "0.10.1.1", "0.33.0")
    assert engine_versions("sglang") == ("0.4.6.post5", "0.5.23")
    assert engine_versions("tgi") == ()  # transcribed, not generated
    # Each flag records the releases that have it: --use-v2-block-manager is gone after 0.6.
    assert DATA["engines"]["vllm"]["flags"]["use-v2-block-manager"]["versions"] == ["0.6.6.post1"]


def test_generated_grammar_parses_like_the_engines():
    assert {"tensor-parallel-size", "max-model-len", "kv-cache-memory-bytes"} <= VLLM.value
    assert {"enforce-eager", "enable-prefix-caching", "enable-expert-parallel"} <= VLLM.boolean
    assert "served-model-name" in VLLM.multi and "hf-token" in VLLM.optional
    assert VLLM.aliases["tp"] == "tensor-parallel-size" and VLLM.aliases["O"] == "compilation-config"
    assert SGLANG.aliases["tp-size"] == "tensor-parallel-size"
    assert {"enable-dp-attention", "disable-radix-cache", "enable-ep-moe"} <= SGLANG.boolean  # ep-moe: 0.4.6 only
    # `--tp` and `--dp` are unique prefixes of --tp-size and --dp-size, which SGLang's argparse accepts.
    parsed = parse_args("sglang", ["--model", "m", "--tp", "4", "--enable-dp-attention", "--dp", "4"])
    assert dict(parsed.flags) == {"model-path": "m", "tensor-parallel-size": "4", "enable-dp-attention": "true",
                                  "data-parallel-size": "4"}


def test_extractor_reads_add_argument_get_kwargs_and_annotated_fields():
    script = _script()
    # A vLLM-shaped source: kinds from explicit actions, and from a config field's annotation via get_kwargs.
    vllm_like = ast.parse(textwrap.dedent('''
        class CacheConfig:
            enable_prefix_caching: bool = True
            block_size: int | None = None
            sizes: list[int] | None = None
        def add_cli_args(parser):
            cache_kwargs = get_kwargs(CacheConfig)
            parser.add_argument("--enable-prefix-caching", **{**cache_kwargs["enable_prefix_caching"], "default": None})
            parser.add_argument("--block-size", **cache_kwargs["block_size"])
            parser.add_argument("--cuda-graph-sizes", **cache_kwargs["sizes"])
            parser.add_argument("--tensor-parallel-size", "-tp", type=int)
            parser.add_argument("--trust-remote-code", action="store_true")
    '''))
    flags = script.add_argument_flags(vllm_like, script._annotations(vllm_like))
    assert flags["enable-prefix-caching"] == {"kind": "boolean", "negatable": True, "aliases": []}
    assert flags["block-size"]["kind"] == "value" and flags["cuda-graph-sizes"]["kind"] == "multi"
    assert flags["tensor-parallel-size"]["aliases"] == ["tp"]
    assert flags["trust-remote-code"] == {"kind": "boolean", "negatable": False, "aliases": []}
    # An SGLang-shaped source: annotated fields that add_cli_args_from_dataclass registers.
    sglang_like = ast.parse(textwrap.dedent('''
        class Parallel:
            tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
            enable_dp_attention: A[bool, "DP attention"] = False
            internal: A[bool, Arg(no_cli=True)] = False
            plain: int = 0
    '''))
    fields = script.sglang_field_flags(sglang_like)
    assert fields["tensor-parallel-size"] == {"kind": "value", "negatable": False, "aliases": ["tp-size"]}
    assert fields["enable-dp-attention"]["kind"] == "boolean"
    assert "internal" not in fields and "plain" not in fields
