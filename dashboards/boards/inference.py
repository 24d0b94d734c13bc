"""The inference dashboard: endpoints' KV cache against their queue and preemptions (latency climbs once
the cache is full and requests wait or get preempted), throughput, latency and failures."""

from __future__ import annotations

from alerts.promql import num
from dashboards.board import Board
from dashboards.panels import RATE, RED, SEL, Cell, above, below, heatmap, table, timeseries
from lockstep import thresholds as T

# An inference endpoint's level of generation throughput, as LockstepInferenceThroughputDrop sees it.
TOKENS_LEVEL = (
    f"quantile_over_time({num(T.INFERENCE_THROUGHPUT_BASELINE_QUANTILE)}, "
    f"server:lockstep_inference_generation_tokens:rate5m{{{SEL}}}[{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW}])"
)


def _p95(histogram: str) -> str:
    return (
        f"histogram_quantile(0.95, sum by (le, cluster, instance, server, model) "
        f"(rate({histogram}_bucket{{{SEL}}}[{RATE}])))"
    )


def endpoints() -> list[Cell]:
    """Which endpoints the agent scrapes."""
    return [
        table(
            "Endpoints up",
            [(f"lockstep_inference_up{{{SEL}}}", "")],
            "none",
            "0: the agent could not scrape the engine's own metrics endpoint.",
            below(1),
            width=24,
            height=5,
        ),
    ]


def kv_cache_and_queue() -> list[Cell]:
    """KV cache usage, requests waiting and running, preemptions."""
    return [
        timeseries(
            "KV cache usage",
            [(f"lockstep_inference_kv_cache_usage_ratio{{{SEL}}}", "{{instance}} {{server}} {{model}}")],
            "percentunit",
            f"LockstepKVCachePressure fires above {T.KV_CACHE_USAGE_RATIO:.0%} while requests wait, for 5 minutes.",
            above((T.KV_CACHE_USAGE_RATIO, RED)),
        ),
        timeseries(
            "Requests waiting and running",
            [
                (f"lockstep_inference_requests_waiting{{{SEL}}}", "{{instance}} {{server}} waiting"),
                (f"lockstep_inference_requests_running{{{SEL}}}", "{{instance}} {{server}} running"),
            ],
            "short",
            "Waiting requests add their whole wait to time to first token.",
        ),
        timeseries(
            "Preemptions per minute",
            [(f"rate(lockstep_inference_preemptions_total{{{SEL}}}[{RATE}]) * 60", "{{instance}} {{server}}")],
            "cpm",
            f"LockstepKVCachePreemptions fires above {T.KV_PREEMPTIONS_PER_MINUTE:g} a minute (5 min) for 5 minutes.",
            above((T.KV_PREEMPTIONS_PER_MINUTE, RED)),
        ),
    ]


def generation_throughput() -> list[Cell]:
    """Tokens per second against the level of the last hour."""
    return [
        timeseries(
            "Generation tokens per second",
            [
                (
                    f"server:lockstep_inference_generation_tokens:rate5m{{{SEL}}}",
                    "{{instance}} {{server}} {{model}}",
                ),
                (TOKENS_LEVEL, "{{instance}} {{server}} level of the last hour"),
            ],
            "short",
            "Output tokens per second (5 min rate), and each endpoint's level of the last "
            f"{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW}: the "
            f"{num(T.INFERENCE_THROUGHPUT_BASELINE_QUANTILE * 100)}th percentile of its rate, which "
            "LockstepInferenceThroughputDrop compares with.",
        ),
        timeseries(
            "Generation throughput against its last hour",
            [
                (
                    f"server:lockstep_inference_generation_tokens:rate5m{{{SEL}}}\n/ {TOKENS_LEVEL}",
                    "{{instance}} {{server}}",
                )
            ],
            "percentunit",
            f"LockstepInferenceThroughputDrop fires below {T.INFERENCE_THROUGHPUT_DROP_RATIO:.0%} while requests "
            "wait, for 10 minutes (below it with an empty queue: demand fell, not capacity).",
            below(T.INFERENCE_THROUGHPUT_DROP_RATIO),
        ),
    ]


def latency_and_failures() -> list[Cell]:
    """Time to first token, failed requests, finish reasons, end-to-end latency."""
    return [
        timeseries(
            "Time to first token (p95)",
            [
                (
                    f"server:lockstep_inference_time_to_first_token_seconds:p95_5m{{{SEL}}}",
                    "{{instance}} {{server}} {{model}}",
                )
            ],
            "s",
            "p95 over 5 minutes. LockstepInferenceTTFTHigh fires above the SLO "
            f"({num(T.INFERENCE_TTFT_SLO_SECONDS)} s, the line; models listed in "
            "INFERENCE_TTFT_SLO_SECONDS_BY_MODEL have their own) for 10 minutes.",
            above((T.INFERENCE_TTFT_SLO_SECONDS, RED)),
        ),
        timeseries(
            "Aborted or failed requests (share)",
            [(f"server:lockstep_inference_requests_failed:ratio5m{{{SEL}}}", "{{instance}} {{server}} {{model}}")],
            "percentunit",
            f"Share of finished requests with reason abort or error (5 min). LockstepInferenceErrors fires above "
            f"{T.INFERENCE_FAILED_REQUESTS_RATIO:.0%} for 10 minutes on endpoints finishing at least "
            f"{num(T.INFERENCE_MIN_REQUESTS_PER_MINUTE)} requests a minute. Only engines that count their "
            "requests that ended well (vLLM, TGI, Triton, Dynamo; not SGLang) have a share.",
            above((T.INFERENCE_FAILED_REQUESTS_RATIO, RED)),
        ),
        timeseries(
            "Requests finished per minute by reason",
            [
                (
                    f"sum by (cluster, instance, server, model, reason) "
                    f"(rate(lockstep_inference_requests_finished_total{{{SEL}}}[{RATE}])) * 60",
                    "{{instance}} {{server}} {{reason}}",
                )
            ],
            "cpm",
            "stop, length, abort, error, success, or the engine's own reason (vLLM's repetition): only the "
            "reasons the engine tells apart (docs/workloads.md).",
        ),
        timeseries(
            "End-to-end latency and queue time (p95)",
            [
                (_p95("lockstep_inference_e2e_request_latency_seconds"), "{{instance}} {{server}} end to end"),
                (_p95("lockstep_inference_request_queue_time_seconds"), "{{instance}} {{server}} queued"),
            ],
            "s",
            "Arrival to last token, and the part spent waiting in the engine's queue.",
        ),
    ]


def capacity_and_refusals() -> list[Cell]:
    """KV cache capacity, prefix cache hits from outside the GPU, speculative decoding, refusals and 5xx."""
    return [
        timeseries(
            "KV cache capacity (tokens)",
            [(f"lockstep_inference_kv_cache_capacity_tokens{{{SEL}}}", "{{instance}} {{server}} {{model}}")],
            "short",
            "Tokens the KV cache holds when full, over the engine's data-parallel replicas: usage × capacity is "
            "the tokens in use.",
        ),
        timeseries(
            "Prefix cache hit ratio, and the part served from outside the GPU",
            [
                (
                    f"rate(lockstep_inference_prefix_cache_hits_total{{{SEL}}}[{RATE}])\n"
                    f"/ rate(lockstep_inference_prefix_cache_queries_total{{{SEL}}}[{RATE}])",
                    "{{instance}} {{server}} all tiers",
                ),
                (
                    f"rate(lockstep_inference_prefix_cache_external_hits_total{{{SEL}}}[{RATE}])\n"
                    f"/ rate(lockstep_inference_prefix_cache_queries_total{{{SEL}}}[{RATE}])",
                    "{{instance}} {{server}} outside the GPU",
                ),
            ],
            "percentunit",
            "Prompt tokens served from a cache; outside the GPU: vLLM's KV connector, SGLang's host and storage tiers.",
        ),
        timeseries(
            "Speculative decoding acceptance",
            [
                (
                    f"rate(lockstep_inference_spec_decode_accepted_tokens_total{{{SEL}}}[{RATE}])\n"
                    f"/ rate(lockstep_inference_spec_decode_draft_tokens_total{{{SEL}}}[{RATE}])",
                    "{{instance}} {{server}} {{model}}",
                )
            ],
            "percentunit",
            "Share of draft tokens the target model accepted: low, and the draft costs more than it saves.",
        ),
        timeseries(
            "Refused at the queue limit and HTTP 5xx per minute",
            [
                (
                    f"rate(lockstep_inference_requests_rejected_total{{{SEL}}}[{RATE}]) * 60",
                    "{{instance}} {{server}} refused",
                ),
                (
                    f"rate(lockstep_inference_http_server_errors_total{{{SEL}}}[{RATE}]) * 60",
                    "{{instance}} {{server}} 5xx",
                ),
            ],
            "cpm",
            "Requests refused because the engine's queue was full, and the API server's 5xx answers.",
        ),
    ]


def kv_cache_across_endpoints() -> list[Cell]:
    """KV cache usage against the queue, and across endpoints as a heatmap."""
    return [
        timeseries(
            "KV cache usage (5 min average) against queue",
            [
                (
                    f"server:lockstep_inference_kv_cache_usage_ratio:avg5m{{{SEL}}}",
                    "{{instance}} {{server}} KV",
                ),
                (
                    f"server:lockstep_inference_requests_waiting:avg5m{{{SEL}}}",
                    "{{instance}} {{server}} waiting",
                ),
            ],
            "short",
            "Both on one axis: KV usage 0-1, waiting requests as counted.",
        ),
        heatmap(
            "KV cache usage across endpoints",
            f"lockstep_inference_kv_cache_usage_ratio{{{SEL}}}",
            "percentunit",
            width=24,
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-inference",
        "Lockstep / Inference",
        "Inference endpoints' KV cache against their queue and preemptions: latency climbs once the cache is "
        "full and requests wait or get preempted.",
        [
            *endpoints(),
            *kv_cache_and_queue(),
            *generation_throughput(),
            *latency_and_failures(),
            *capacity_and_refusals(),
            *kv_cache_across_endpoints(),
        ],
    )
