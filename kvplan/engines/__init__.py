"""Engine models: how vLLM, SGLang and Transformers size memory and the KV cache, reproduced in pure Python."""

ENGINES = ("vllm", "sglang", "transformers", "generic")
