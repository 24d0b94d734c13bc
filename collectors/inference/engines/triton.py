"""Triton Inference Server with the TensorRT-LLM backend: its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import Reading, Samples, per_model, ratio, readings_by_model


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
    )
