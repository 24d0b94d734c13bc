"""Triton Inference Server with the TensorRT-LLM backend: its /metrics read into the normalised Readings.

Each model is reported under its own ``model`` label; ``version`` values are added up. Triton
counts a request to an ensemble under the ensemble and each of its steps under the composing
model that ran it (core's ensemble scheduler reports both), and its /metrics does not say which
model is an ensemble: each model's numbers are exact, a server's models are not to be added up
(docs/workloads.md; tests/fixtures/inference/triton-ensemble.json).
"""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    Reading,
    Samples,
    finished_by_reason,
    merge,
    per_model,
    product,
    ratio,
    readings_by_model,
)


def _failures(s: Samples) -> list[tuple[dict[str, str], float]]:
    return s.first("nv_inference_request_failure", "nv_inference_request_failure_total")


def normalise(s: Samples) -> dict[str, Reading]:
    model = "model"
    blocks = "nv_trt_llm_kv_cache_block_metrics"
    usage = ratio(
        per_model(s.where(blocks, kv_cache_block_type="used"), model),
        per_model(s.where(blocks, kv_cache_block_type="max"), model),
    )
    for name, fraction in per_model(s.where(blocks, kv_cache_block_type="fraction"), model, max).items():
        usage.setdefault(name, fraction)
    return readings_by_model(
        kv_cache_usage=usage,
        waiting=per_model(s.where("nv_trt_llm_request_metrics", request_type="waiting"), model),
        running=per_model(s.where("nv_trt_llm_request_metrics", request_type="scheduled"), model),
        # Triton counts failed requests by reason (REJECTED, CANCELED, BACKEND, OTHER); its
        # successes are not split by stop or length. CANCELED is the client giving up.
        # Exposed without _total; the parser names a typed counter's samples with it.
        finished=merge(
            finished_by_reason(
                s.first("nv_inference_request_success", "nv_inference_request_success_total"),
                model,
                lambda _: "success",
            ),
            finished_by_reason(
                _failures(s), model, lambda labels: "abort" if labels.get("reason") == "CANCELED" else "error"
            ),
        ),
        # REJECTED: refused by the scheduler (its queue was full, max_queue_size).
        rejected=per_model([(lb, v) for lb, v in _failures(s) if lb.get("reason") == "REJECTED"], model),
        kv_capacity_tokens=product(
            per_model(s.where(blocks, kv_cache_block_type="max"), model),
            per_model(s.where(blocks, kv_cache_block_type="tokens_per"), model, max),
        ),
        # No token counters and no latency histograms by default: Triton's durations
        # (nv_inference_request_duration_us, nv_inference_queue_duration_us) are cumulative
        # microsecond counters, not histograms, so they have no quantiles to re-export.
    )
