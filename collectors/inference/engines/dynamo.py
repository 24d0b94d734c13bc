"""NVIDIA Dynamo: its /metrics read into the normalised Readings.

Written from Dynamo's source (lib/runtime/src/metrics/prometheus_names.rs and the frontend's
HTTP service; tests/fixtures/inference/ says which versions): the frontend counts requests
by ``status`` (success, error) and, in current releases, ``error_type`` (validation,
not_found, overload, cancelled, internal, not_implemented). ``inflight_requests`` counts every
request between arrival and its end, the ``queued_requests`` (no first response yet) among
them. Previous releases named the two gauges ``..._inflight_requests_total`` and
``..._queued_requests_total`` and had no ``error_type``.
"""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    Reading,
    Samples,
    finished_by_reason,
    histogram_sums,
    histograms,
    per_model,
    product,
    ratio,
    readings_by_model,
)

# error_type values that are HTTP 5xx answers (overload is 503, internal 500, not_implemented 501).
SERVER_ERROR_TYPES = ("overload", "internal", "not_implemented")


def _reason(labels: dict[str, str]) -> str:
    if labels.get("status") == "success":
        return "success"
    # A client that went away (or its timeout) is an abort, not the engine failing.
    return "abort" if labels.get("error_type") == "cancelled" else "error"


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
    waiting = per_model(s.first("dynamo_frontend_queued_requests", "dynamo_frontend_queued_requests_total"), model)
    inflight = per_model(s.first("dynamo_frontend_inflight_requests", "dynamo_frontend_inflight_requests_total"), model)
    requests = s.first("dynamo_frontend_requests_total")
    return readings_by_model(
        kv_cache_usage=usage,
        waiting=waiting,
        # In flight includes the queued: running is the difference.
        running={m: max(0.0, n - waiting.get(m, 0.0)) for m, n in inflight.items()},
        ttft=histograms(s, ["dynamo_frontend_time_to_first_token_seconds"], model),
        itl=histograms(s, ["dynamo_frontend_inter_token_latency_seconds"], model),
        # The frontend counts tokens as per-request histograms: their sums are the counters.
        prompt_tokens=histogram_sums(s, "dynamo_frontend_input_sequence_tokens", model),
        generation_tokens=histogram_sums(s, "dynamo_frontend_output_sequence_tokens", model),
        # ... and, in current releases, output tokens as they stream (not when a request ends).
        decode_tokens=per_model(s.first("dynamo_frontend_output_tokens_total"), model),
        finished=finished_by_reason(requests, model, _reason),
        rejected=per_model([(lb, v) for lb, v in requests if lb.get("error_type") == "overload"], model),
        http_server_errors=per_model(
            [(lb, v) for lb, v in requests if lb.get("error_type") in SERVER_ERROR_TYPES], model
        ),
        e2e_latency=histograms(s, ["dynamo_frontend_request_duration_seconds"], model),
        # Blocks of every worker serving the model × tokens per block.
        kv_capacity_tokens=product(
            per_model(s.first("dynamo_frontend_model_total_kv_blocks"), model),
            per_model(s.first("dynamo_frontend_model_kv_cache_block_size"), model, max),
        ),
    )
