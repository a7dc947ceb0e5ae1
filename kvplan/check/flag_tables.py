"""Which command-line flags vLLM, SGLang and TGI accept, and which of them take a value.

Needed to parse argv the way the engine does: after a boolean flag such as `--enforce-eager` the next word
is a positional (vLLM's model), after `--max-model-len` it is the value. Names are the engines' long
options without the leading dashes; aliases map to the name kvplan reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineFlags:
    """One engine's argument grammar."""

    value: frozenset[str]  # take exactly one value
    boolean: frozenset[str]  # take none (vLLM also accepts --no-NAME and, for old releases, =true/false)
    multi: frozenset[str] = frozenset()  # nargs='+': every following word up to the next flag
    optional: frozenset[str] = frozenset()  # nargs='?': a value only if the next word is not a flag
    aliases: dict[str, str] = field(default_factory=dict)  # alias (long or short, no dashes) -> name
    underscores: bool = False  # vLLM's parser turns --max_model_len into --max-model-len
    abbreviations: bool = False  # argparse's allow_abbrev: a unique prefix selects the flag
    negatable: bool = False  # --no-enable-prefix-caching

    @property
    def names(self) -> frozenset[str]:
        return self.value | self.boolean | self.multi | self.optional


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


VLLM = EngineFlags(
    value=_words(
        """
        model task runner convert tokenizer tokenizer-mode dtype seed hf-config-path allowed-local-media-path
        allowed-media-domains revision code-revision rope-scaling rope-theta tokenizer-revision max-model-len
        quantization max-seq-len-to-capture max-logprobs logprobs-mode config-format hf-overrides
        override-neuron-config override-pooler-config pooler-config logits-processor-pattern generation-config
        override-generation-config model-impl override-attention-dtype io-processor-plugin load-format
        download-dir model-loader-extra-config pt-load-map-location safetensors-load-strategy
        guided-decoding-backend structured-outputs-config distributed-executor-backend pipeline-parallel-size
        tensor-parallel-size decode-context-parallel-size data-parallel-size data-parallel-rank
        data-parallel-start-rank data-parallel-size-local data-parallel-address data-parallel-rpc-port
        data-parallel-backend eplb-config expert-placement-strategy num-redundant-experts eplb-window-size
        eplb-step-interval max-parallel-loading-workers worker-cls worker-extension-cls all2all-backend
        block-size gpu-memory-utilization kv-cache-memory kv-cache-memory-bytes swap-space kv-cache-dtype
        num-gpu-blocks-override prefix-caching-hash-algo cpu-offload-gb mamba-cache-dtype mamba-ssm-cache-dtype
        kv-offloading-size kv-offloading-backend limit-mm-per-prompt media-io-kwargs mm-processor-kwargs
        mm-processor-cache-gb mm-processor-cache-type mm-encoder-tp-mode video-pruning-rate max-loras
        max-lora-rank lora-extra-vocab-size lora-dtype max-cpu-loras default-mm-loras long-lora-scaling-factors
        max-prompt-adapters max-prompt-adapter-token device speculative-config num-speculative-tokens
        speculative-model speculative-draft-tensor-parallel-size speculative-max-model-len
        speculative-disable-by-batch-size ngram-prompt-lookup-max ngram-prompt-lookup-min
        spec-decoding-acceptance-method typical-acceptance-sampler-posterior-threshold
        typical-acceptance-sampler-posterior-alpha show-hidden-metrics-for-version otlp-traces-endpoint
        collect-detailed-traces max-num-batched-tokens max-num-seqs max-num-partial-prefills
        max-long-partial-prefills long-prefill-token-threshold num-lookahead-slots scheduler-delay-factor
        preemption-mode num-scheduler-steps scheduling-policy scheduler-cls max-cudagraph-capture-size
        kv-transfer-config kv-events-config compilation-config additional-config ec-transfer-config
        tokenizer-pool-size tokenizer-pool-type tokenizer-pool-extra-config max-context-len-to-capture
        qlora-adapter-name-or-path host port uvicorn-log-level api-key chat-template chat-template-content-format
        response-role ssl-keyfile ssl-certfile ssl-ca-certs ssl-cert-reqs root-path tool-call-parser
        tool-parser-plugin reasoning-parser max-log-len uds log-config-file config api-server-count
        h11-max-incomplete-event-size h11-max-header-count tool-server default-chat-template-kwargs
        logits-processors
        """
    ),
    boolean=_words(
        """
        trust-remote-code enforce-eager disable-sliding-window disable-cascade-attn skip-tokenizer-init
        enable-prompt-embeds disable-async-output-proc enable-sleep-mode use-tqdm-on-load
        data-parallel-hybrid-lb data-parallel-external-lb enable-expert-parallel enable-eplb
        eplb-log-balancedness ray-workers-use-nsight disable-custom-all-reduce
        enable-multimodal-encoder-data-parallel enable-dbo enable-prefix-caching calculate-kv-scales
        kv-sharing-fast-prefill disable-mm-preprocessor-cache interleave-mm-strings skip-mm-profiling
        enable-lora enable-lora-bias fully-sharded-loras enable-prompt-adapter multi-step-stream-outputs
        enable-chunked-prefill disable-chunked-mm-input disable-hybrid-kv-cache-manager async-scheduling
        use-v2-block-manager worker-use-ray engine-use-ray disable-log-requests enable-log-requests
        enable-log-outputs disable-log-stats enable-auto-tool-choice enable-request-id-headers
        disable-frontend-multiprocessing enable-prompt-tokens-details enable-server-load-tracking
        enable-force-include-usage disable-fastapi-docs disable-uvicorn-access-log return-tokens-as-token-ids
        enable-tokenizer-info-endpoint trust-request-chat-template exclude-tools-when-tool-choice-none
        headless log-error-stack enable-ssl-refresh
        """
    ),
    multi=_words(
        """
        served-model-name lora-modules prompt-adapters allowed-origins allowed-methods allowed-headers
        middleware cuda-graph-sizes ignore-patterns
        """
    ),
    optional=_words("hf-token"),
    aliases={
        "tp": "tensor-parallel-size",
        "pp": "pipeline-parallel-size",
        "dp": "data-parallel-size",
        "dpl": "data-parallel-size-local",
        "dpn": "data-parallel-rank",
        "dpa": "data-parallel-address",
        "dpp": "data-parallel-rpc-port",
        "dpb": "data-parallel-backend",
        "dcp": "decode-context-parallel-size",
        "q": "quantization",
        "O": "compilation-config",
        "kv-cache-memory-bytes": "kv-cache-memory",
    },
    underscores=True,
    abbreviations=True,
    negatable=True,
)

SGLANG = EngineFlags(
    value=_words(
        """
        model-path tokenizer-path host port tokenizer-mode load-format dtype kv-cache-dtype quantization
        quantization-param-path context-length device served-model-name chat-template completion-template
        revision mem-fraction-static max-running-requests max-total-tokens chunked-prefill-size
        max-prefill-tokens schedule-policy schedule-conservativeness cpu-offload-gb page-size
        tensor-parallel-size pipeline-parallel-size data-parallel-size expert-parallel-size stream-interval
        random-seed constrained-json-whitespace-pattern watchdog-timeout dist-timeout download-dir base-gpu-id
        gpu-id-step log-level log-level-http log-requests-level decode-log-interval api-key file-storage-path
        reasoning-parser tool-call-parser dist-init-addr nnodes node-rank json-model-override-args
        max-loras-per-batch lora-backend attention-backend sampling-backend grammar-backend
        speculative-algorithm speculative-draft-model-path speculative-num-steps speculative-eagle-topk
        speculative-num-draft-tokens torch-compile-max-bs cuda-graph-max-bs torchao-config
        triton-attention-num-kv-splits num-continuous-decode-steps hicache-ratio hicache-size
        mm-attention-backend moe-a2a-backend moe-runner-backend deepep-mode ep-num-redundant-experts
        expert-distribution-recorder-mode init-expert-location tool-server max-lora-rank
        """
    ),
    boolean=_words(
        """
        skip-tokenizer-init trust-remote-code is-embedding log-requests show-time-cost enable-metrics
        enable-cache-report enable-double-sparsity disable-radix-cache disable-cuda-graph
        disable-cuda-graph-padding enable-nccl-nvls disable-outlines-disk-cache disable-custom-all-reduce
        disable-mla disable-overlap-schedule enable-mixed-chunk enable-dp-attention enable-ep-moe
        enable-torch-compile enable-nan-detection enable-p2p-check triton-attention-reduce-in-fp32
        delete-ckpt-after-loading enable-memory-saver allow-auto-truncate enable-custom-logit-processor
        enable-hierarchical-cache disable-shared-experts-fusion enable-deepep-moe enable-eplb enable-lora
        """
    ),
    multi=_words("cuda-graph-bs lora-paths"),
    aliases={
        "model": "model-path",
        "tp-size": "tensor-parallel-size",
        "tp": "tensor-parallel-size",
        "pp-size": "pipeline-parallel-size",
        "pp": "pipeline-parallel-size",
        "dp-size": "data-parallel-size",
        "dp": "data-parallel-size",
        "ep-size": "expert-parallel-size",
        "ep": "expert-parallel-size",
    },
    abbreviations=True,
)

TGI = EngineFlags(
    value=_words(
        """
        model-id revision validation-workers sharded num-shard quantize speculate dtype kv-cache-dtype
        max-concurrent-requests max-best-of max-stop-sequences max-top-n-tokens max-input-tokens
        max-input-length max-total-tokens waiting-served-ratio max-batch-prefill-tokens max-batch-total-tokens
        max-waiting-tokens max-batch-size cuda-graphs hostname port prometheus-port shard-uds-path master-addr
        master-port huggingface-hub-cache weights-cache-override cuda-memory-fraction rope-scaling rope-factor
        otlp-endpoint otlp-service-name cors-allow-origin api-key watermark-gamma watermark-delta
        ngrok-authtoken ngrok-edge tokenizer-config-path max-client-batch-size lora-adapters usage-stats
        payload-limit graceful-termination-timeout
        """
    ),
    boolean=_words(
        "trust-remote-code disable-custom-kernels json-output ngrok disable-grammar-support env enable-prefill-logprobs"
    ),
)

# KServe's huggingface runtime parses its own flags next to vLLM's (written with underscores).
KSERVE_HF_VALUE = _words(
    """
    model-name model-id model-dir model-revision tokenizer-revision backend task max-length http-port grpc-port
    workers predictor-host predictor-protocol tensor-input-names
    """
)
KSERVE_HF_BOOLEAN = _words(
    """
    disable-lower-case disable-special-tokens return-probabilities return-token-type-ids return-raw-logits
    enable-docs-url
    """
)

ENGINES = {"vllm": VLLM, "sglang": SGLANG, "tgi": TGI}
