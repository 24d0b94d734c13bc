"""SGLang: its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    Reading,
    Samples,
    finished_by_reason,
    histograms,
    per_model,
    readings_by_model,
)


def normalise(s: Samples) -> dict[str, Reading]:
    model = "model_name"
    return readings_by_model(
        kv_cache_usage=per_model(s.first("sglang:token_usage"), model, max),
        waiting=per_model(s.first("sglang:num_queue_reqs"), model),
        running=per_model(s.first("sglang:num_running_reqs"), model),
        # The counter; sglang:num_retracted_reqs is the last batch's gauge, not a count.
        preemptions=per_model(s.first("sglang:num_retracted_requests_total"), model),
        prefix_hits=per_model(s.first("sglang:cached_tokens_total"), model),
        prefix_queries=per_model(s.first("sglang:prompt_tokens_total"), model),
        ttft=histograms(s, ["sglang:time_to_first_token_seconds"], model),
        itl=histograms(s, ["sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"], model),
        prompt_tokens=per_model(s.first("sglang:prompt_tokens_total"), model),
        generation_tokens=per_model(s.first("sglang:generation_tokens_total"), model),
        # SGLang counts all requests and the aborted ones, not why the others ended: only
        # "abort" is known (requests_total minus aborts is not stop, it is stop + length).
        finished=finished_by_reason(s.first("sglang:num_aborted_requests_total"), model, lambda _: "abort"),
        e2e_latency=histograms(s, ["sglang:e2e_request_latency_seconds"], model),
        queue_time=histograms(s, ["sglang:queue_time_seconds"], model),
    )
