"""The inference collector's metrics, declared once (the collector emits them in this order)."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

LABELS = ("engine", "endpoint", "model")

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
    "Time between output tokens, the engine's own histogram re-exported (TGI: per-request mean).",
    LABELS,
    unit="seconds",
)
PROCESS_INFO = MetricSpec(
    "lockstep_inference_process_info",
    "gauge",
    "A process of a local engine (its server and every process below it), with the Slurm job it runs "
    'in ("" if none); the engine\'s GPUs are those whose NVML compute-process list has one of these pids. Always 1.',
    ("engine", "endpoint", "pid", "job_id"),
)

GPU_INFO = MetricSpec(
    "lockstep_inference_gpu_info",
    "gauge",
    "A GPU a local engine runs on (one of the engine's processes is in the GPU's NVML compute-process "
    "list); gpu is the NVML index as on lockstep_gpu_* series. Always 1.",
    ("engine", "endpoint", "gpu", "uuid"),
)
