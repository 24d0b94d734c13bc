"""vLLM: its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import Reading, Samples, histograms, per_model, readings_by_model


def normalise(s: Samples) -> dict[str, Reading]:
    model = "model_name"
    return readings_by_model(
        kv_cache_usage=per_model(s.first("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), model, max),
        waiting=per_model(s.first("vllm:num_requests_waiting"), model),
        running=per_model(s.first("vllm:num_requests_running"), model),
        preemptions=per_model(s.first("vllm:num_preemptions_total"), model),
        prefix_hits=per_model(s.first("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), model),
        prefix_queries=per_model(
            s.first("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"), model
        ),
        ttft=histograms(s, ["vllm:time_to_first_token_seconds"], model),
        itl=histograms(s, ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"], model),
    )
