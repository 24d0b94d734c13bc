"""vLLM: its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    FINISH_REASONS,
    Reading,
    Samples,
    finished_by_reason,
    histograms,
    per_model,
    readings_by_model,
)


def _reason(labels: dict[str, str]) -> str | None:
    # vLLM's finished_reason is already stop, length, abort (and error in newer versions).
    reason = labels.get("finished_reason")
    return reason if reason in FINISH_REASONS else None


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
        prompt_tokens=per_model(s.first("vllm:prompt_tokens_total"), model),
        generation_tokens=per_model(s.first("vllm:generation_tokens_total"), model),
        finished=finished_by_reason(s.first("vllm:request_success_total"), model, _reason),
        e2e_latency=histograms(s, ["vllm:e2e_request_latency_seconds"], model),
        queue_time=histograms(s, ["vllm:request_queue_time_seconds"], model),
    )
