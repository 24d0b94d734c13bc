"""SGLang: its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import Reading, Samples, histograms, per_model, readings_by_model


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
    )
