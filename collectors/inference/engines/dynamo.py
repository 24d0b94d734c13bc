"""NVIDIA Dynamo: its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    Reading,
    Samples,
    finished_by_reason,
    histogram_sums,
    histograms,
    per_model,
    ratio,
    readings_by_model,
)


def normalise(s: Samples) -> dict[str, Reading]:
    model = "model"
    usage = ratio(
        per_model(s.first("dynamo_component_kvstats_active_blocks"), model),
        per_model(s.first("dynamo_component_kvstats_total_blocks"), model),
    )
    # Named "percent", documented by Dynamo as 0.0-1.0: read as a fraction, and as a
    # percentage (divided by 100) only when it is above 1.
    for name, value in per_model(s.first("dynamo_component_kvstats_gpu_cache_usage_percent"), model, max).items():
        usage.setdefault(name, value / 100.0 if value > 1.0 else value)
    return readings_by_model(
        kv_cache_usage=usage,
        waiting=per_model(s.first("dynamo_frontend_queued_requests"), model),
        running=per_model(s.first("dynamo_frontend_inflight_requests"), model),
        ttft=histograms(s, ["dynamo_frontend_time_to_first_token_seconds"], model),
        itl=histograms(s, ["dynamo_frontend_inter_token_latency_seconds"], model),
        # The frontend counts tokens as per-request histograms: their sums are the counters.
        prompt_tokens=histogram_sums(s, "dynamo_frontend_input_sequence_tokens", model),
        generation_tokens=histogram_sums(s, "dynamo_frontend_output_sequence_tokens", model),
        # requests_total{status} says success or error, not why a success ended.
        finished=finished_by_reason(
            s.where("dynamo_frontend_requests_total", status="error"), model, lambda _: "error"
        ),
        e2e_latency=histograms(s, ["dynamo_frontend_request_duration_seconds"], model),
    )
