"""vLLM: its /metrics read into the normalised Readings.

vLLM's process model (checked against vLLM 0.33.0's own PrometheusStatLogger, the captures in
tests/fixtures/inference/): every series carries ``engine``, the data-parallel engine core
(``engine="0"``, ``"1"``): replicas, each with its own requests, added up (KV usage: the
fullest). With several API servers, prometheus_client's multiprocess mode already merges the
servers' files into one series per engine. ``finished_reason`` values are parts of the total:
each is kept under its own name (stop, length, abort, error, repetition, and any later one).
"""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    Reading,
    Samples,
    finish_reason,
    finished_by_reason,
    histograms,
    per_model,
    readings_by_model,
    server_wide,
)


def _capacity(labels: dict[str, str]) -> float | None:
    """KV cache capacity in tokens of one engine, from vllm:cache_config_info's labels:
    kv_cache_size_tokens (the engine's own), else num_gpu_blocks × block_size."""
    try:
        if labels.get("kv_cache_size_tokens", "None") != "None":
            return float(labels["kv_cache_size_tokens"])
        return float(labels["num_gpu_blocks"]) * float(labels["block_size"])
    except (KeyError, ValueError):
        return None


def normalise(s: Samples) -> dict[str, Reading]:
    model = "model_name"
    local_hits = per_model(s.first("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), model)
    external_hits = per_model(s.first("vllm:external_prefix_cache_hits_total"), model)
    capacity = [c for labels, _ in s.first("vllm:cache_config_info") if (c := _capacity(labels)) is not None]
    server_errors = [(labels, v) for labels, v in s.first("http_requests_total") if labels.get("status") == "5xx"]
    readings = readings_by_model(
        kv_cache_usage=per_model(s.first("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), model, max),
        waiting=per_model(s.first("vllm:num_requests_waiting"), model),
        running=per_model(s.first("vllm:num_requests_running"), model),
        preemptions=per_model(s.first("vllm:num_preemptions_total"), model),
        # A KV connector (offloading, cross-instance sharing) serves the tokens the GPU's own
        # prefix cache missed: its hits are prefix hits too (its queries are a subset of ours).
        prefix_hits={
            m: local_hits.get(m, 0.0) + external_hits.get(m, 0.0) for m in local_hits.keys() | external_hits.keys()
        },
        prefix_queries=per_model(
            s.first("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"), model
        ),
        prefix_external_hits=external_hits,
        ttft=histograms(s, ["vllm:time_to_first_token_seconds"], model),
        itl=histograms(s, ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"], model),
        prompt_tokens=per_model(s.first("vllm:prompt_tokens_total"), model),
        generation_tokens=per_model(s.first("vllm:generation_tokens_total"), model),
        # vLLM counts generated tokens at every engine step already.
        decode_tokens=per_model(s.first("vllm:generation_tokens_total"), model),
        finished=finished_by_reason(
            s.first("vllm:request_success_total"),
            model,
            lambda labels: finish_reason(labels.get("finished_reason", "")),
        ),
        e2e_latency=histograms(s, ["vllm:e2e_request_latency_seconds"], model),
        queue_time=histograms(s, ["vllm:request_queue_time_seconds"], model),
        spec_draft_tokens=per_model(s.first("vllm:spec_decode_num_draft_tokens_total"), model),
        spec_accepted_tokens=per_model(s.first("vllm:spec_decode_num_accepted_tokens_total"), model),
        # Refused by --max-num-queued-reqs / --max-num-queued-tokens (the API server's count).
        rejected=per_model(s.first("vllm:admission_rejections_total"), model),
    )
    # vllm:cache_config_info (one per engine core) and the API server's HTTP answers
    # (prometheus-fastapi-instrumentator, status grouped as "5xx") carry no model label: they
    # are the server's.
    server_wide(readings, "kv_capacity_tokens", sum(capacity) if capacity else None)
    return server_wide(readings, "http_server_errors", sum(v for _, v in server_errors) if server_errors else None)
