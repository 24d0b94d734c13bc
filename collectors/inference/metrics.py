"""The inference collector's metrics, declared once (the collector emits them in this order)."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

LABELS = ("engine", "server", "model")

UP = MetricSpec(
    "lockstep_inference_up",
    "gauge",
    "1 when the engine's /metrics answered with its metrics in time, 0 when it is down, slow, "
    "answered with an error or with something else.",
    LABELS,
)
KV_CACHE_USAGE = MetricSpec(
    "lockstep_inference_kv_cache_usage_ratio",
    "gauge",
    "Share of the engine's KV cache in use (0..1); near 1 the engine preempts requests and latency "
    "climbs. The most loaded of the engine's data-parallel replicas.",
    LABELS,
    unit="ratio",
)
REQUESTS_WAITING = MetricSpec(
    "lockstep_inference_requests_waiting", "gauge", "Requests queued, not yet scheduled.", LABELS
)
REQUESTS_RUNNING = MetricSpec(
    "lockstep_inference_requests_running", "gauge", "Requests being processed (in the running batch).", LABELS
)
PREEMPTIONS = MetricSpec(
    "lockstep_inference_preemptions_total",
    "counter",
    "Requests preempted for lack of KV cache (vLLM preemptions, SGLang retractions).",
    LABELS,
)
PREFIX_HITS = MetricSpec(
    "lockstep_inference_prefix_cache_hits_total",
    "counter",
    "Prompt tokens served from the prefix cache.",
    LABELS,
)
PREFIX_QUERIES = MetricSpec(
    "lockstep_inference_prefix_cache_queries_total",
    "counter",
    "Prompt tokens looked up in the prefix cache (hit ratio: rate(hits) / rate(queries)).",
    LABELS,
)
TTFT = MetricSpec(
    "lockstep_inference_time_to_first_token_seconds",
    "histogram",
    "Time to first token, the engine's own histogram re-exported.",
    LABELS,
    unit="seconds",
)
ITL = MetricSpec(
    "lockstep_inference_inter_token_latency_seconds",
    "histogram",
    "Time between consecutive output tokens, the engine's own per-token histogram re-exported. "
    "Not for TGI: its histogram holds one per-request mean per request, whose quantiles are not comparable.",
    LABELS,
    unit="seconds",
)
PROMPT_TOKENS = MetricSpec(
    "lockstep_inference_prompt_tokens_total",
    "counter",
    "Prompt (prefill) tokens the engine processed; TGI and Dynamo: the sum of their per-request prompt-length "
    "histograms.",
    LABELS,
)
GENERATION_TOKENS = MetricSpec(
    "lockstep_inference_generation_tokens_total",
    "counter",
    "Output tokens the engine generated (throughput: rate of it); TGI and Dynamo: the sum of their "
    "per-request output-length histograms.",
    LABELS,
)
REQUESTS_FINISHED = MetricSpec(
    "lockstep_inference_requests_finished_total",
    "counter",
    "Requests that ended, by reason: stop (end of sequence or stop string), length (token limit), abort "
    "(client or server gave up on it), error, success (ended well; the engine does not say whether by stop or "
    "length), or the engine's own reason (vLLM's repetition); the sum over reasons is every request that "
    "ended. Only the reasons the engine tells apart (docs/workloads.md).",
    (*LABELS, "reason"),
)
E2E_LATENCY = MetricSpec(
    "lockstep_inference_e2e_request_latency_seconds",
    "histogram",
    "End-to-end request latency, arrival to last token, the engine's own histogram re-exported.",
    LABELS,
    unit="seconds",
)
QUEUE_TIME = MetricSpec(
    "lockstep_inference_request_queue_time_seconds",
    "histogram",
    "Time requests waited in the engine's queue before being scheduled, the engine's own histogram re-exported.",
    LABELS,
    unit="seconds",
)
REQUESTS_REJECTED = MetricSpec(
    "lockstep_inference_requests_rejected_total",
    "counter",
    "Requests refused at the door because the engine's queue limit was reached (vLLM --max-num-queued-reqs/"
    "-tokens, TGI overloaded, Triton REJECTED, Dynamo overload); where the engine also counts them as "
    "finished, they are in requests_finished_total too.",
    LABELS,
)
HTTP_SERVER_ERRORS = MetricSpec(
    "lockstep_inference_http_server_errors_total",
    "counter",
    "HTTP 5xx answers of the engine's API server (vLLM, SGLang with its HTTP metrics on; Dynamo: requests "
    "ending in an internal, not-implemented or overload error).",
    LABELS,
)
SPEC_DRAFT_TOKENS = MetricSpec(
    "lockstep_inference_spec_decode_draft_tokens_total",
    "counter",
    "Tokens proposed by speculative decoding's draft (acceptance: rate(accepted) / rate(draft)).",
    LABELS,
)
SPEC_ACCEPTED_TOKENS = MetricSpec(
    "lockstep_inference_spec_decode_accepted_tokens_total",
    "counter",
    "Draft tokens the target model accepted.",
    LABELS,
)
PREFIX_EXTERNAL_HITS = MetricSpec(
    "lockstep_inference_prefix_cache_external_hits_total",
    "counter",
    "Prompt tokens served from a cache outside the GPU's own prefix cache (vLLM's KV connector, SGLang's host "
    "and storage tiers); included in prefix_cache_hits_total.",
    LABELS,
)
DECODE_TOKENS = MetricSpec(
    "lockstep_inference_decode_tokens_total",
    "counter",
    "Output tokens counted as each engine step produces them (not when the request ends, so long generations "
    "do not make throughput bursty): vLLM's generation counter, SGLang's per-step counter, Dynamo's "
    "streaming counter.",
    LABELS,
)
KV_CACHE_CAPACITY = MetricSpec(
    "lockstep_inference_kv_cache_capacity_tokens",
    "gauge",
    "Tokens the engine's KV cache holds when full, over its data-parallel replicas.",
    LABELS,
)
PROCESS_INFO = MetricSpec(
    "lockstep_inference_process_info",
    "gauge",
    "A process of a local engine (its server and every process below it), with the Slurm job it runs "
    'in ("" if none); the engine\'s GPUs are those whose NVML compute-process list has one of these pids. Always 1.',
    ("engine", "server", "pid", "job_id"),
)

GPU_INFO = MetricSpec(
    "lockstep_inference_gpu_info",
    "gauge",
    "A GPU a local engine runs on (one of the engine's processes is in the GPU's NVML compute-process "
    "list); gpu is the NVML index as on lockstep_gpu_* series. Always 1.",
    ("engine", "server", "gpu", "uuid"),
)

# Issue 29: what the collector leaves out of engines' answers, and what discovery finds.
SKIPPED_VALUES = MetricSpec(
    "lockstep_inference_skipped_values_total",
    "counter",
    "Values of the engine's answers left out since the agent started: a sample that is not a finite number "
    "of at least 0, or a histogram series that is not a valid histogram (a bound that is NaN, negative or "
    "given twice, no +Inf bucket, counts that decrease).",
    ("engine", "server"),
)
DISCOVERED_PROCESSES = MetricSpec(
    "lockstep_inference_discovered_processes",
    "gauge",
    "Processes whose command line and listening port look like an engine's, in the last round, by category: "
    "engine (answered as its engine: scraped and reported), probing (not yet answered as one: probed in turn, "
    "a few per round, a silent one less and less often), over_cap (beyond the 32 discovered targets looked at), "
    "unreadable (its sockets cannot be read: another user's process, agent not root), other_namespace "
    "(another network namespace: a container).",
    ("category",),
)
