"""`estimate --json` keeps its published contract (kvplan/schemas/estimate.schema.json) in every case."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from tests.conftest import run_json

SCHEMA = json.loads(resources.files("kvplan.schemas").joinpath("estimate.schema.json").read_text())
CASES = [
    ["meta-llama/Llama-3.1-8B-Instruct", "--seq", "8192", "--batch", "32", "--gpu", "H100"],
    ["meta-llama/Llama-3.1-8B-Instruct", "--seq", "131072", "--batch", "16", "--gpu", "H100"],  # does not fit
    ["meta-llama/Llama-3.1-8B-Instruct", "--seq", "8192", "--tp", "3", "--gpu", "H100"],  # refused before sizing
    ["meta-llama/Llama-2-7b", "--seq", "32768", "--batch", "16"],  # no GPU named, refused everywhere
    ["meta-llama/Llama-3.1-8B-Instruct", "--seq", "8192", "--kv-cache-memory-bytes", "20GiB"],
    ["openai/gpt-oss-20b", "--seq", "65536", "--gpu", "H100", "--engine", "sglang"],
    ["nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "--seq", "8192", "--gpu", "H100", "--engine", "sglang"],
    ["meta-llama/Llama-3.1-8B-Instruct", "--seq", "4096", "--gpu", "L4", "--engine", "transformers"],
    ["meta-llama/Llama-3.1-8B-Instruct", "--seq", "4096", "--gpu", "L4", "--engine", "generic"],
    ["meta-llama/Llama-3.1-8B-Instruct", "--seq", "4096", "--gpu", "L4", "--engine", "tgi"],
    ["deepseek-ai/DeepSeek-V2-Lite", "--seq", "32768", "--batch", "8", "--gpu", "A100-80GB", "--num-gpus", "2"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: "-".join(a[:1] + a[-2:]))
def test_output_matches_the_schema(runner, args):
    jsonschema.validate(run_json(runner, "estimate", *args), SCHEMA)


def test_the_schema_rejects_a_wrong_type(runner):
    doc = run_json(runner, "estimate", *CASES[0])
    doc["gpus"][0]["max_requests"] = 54.5  # whole requests are an integer in every engine
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)
