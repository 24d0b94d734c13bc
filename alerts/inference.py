"""Inference alerts: KV cache pressure and preemptions, throughput drops, time to first token
above its SLO, failed requests.  They sit in the lockstep-workloads.alerts group (alerts/rules.py)."""

from __future__ import annotations

import json

from alerts.model import Alert
from alerts.promql import VALUE_2F, VALUE_PERCENT, WHERE, label, num, percent
from alerts.recording import FAILED_RATIO, FINISHED_RATE, TOKENS_RATE, TTFT_P95
from lockstep import thresholds as T


def _quoted(value: str) -> str:
    """A PromQL string literal (Go's escapes, which JSON's are for these characters)."""
    return json.dumps(value)


def above_ttft_slo(default: float, by_model: dict[str, float]) -> str:
    """The p95 time to first token where it is above its SLO: the model's own SLO for the models
    listed in by_model (thresholds.py INFERENCE_TTFT_SLO_SECONDS_BY_MODEL), the default for the rest."""
    others = ", ".join(f"model!={_quoted(model)}" for model in by_model)
    clauses = [f"{TTFT_P95}{{{others}}} > {num(default)}" if others else f"{TTFT_P95} > {num(default)}"]
    clauses += [f"{TTFT_P95}{{model={_quoted(model)}}} > {num(slo)}" for model, slo in by_model.items()]
    return "\nor\n".join(clauses)


def ttft_slo_text(default: float, by_model: dict[str, float]) -> str:
    """The alerted model's SLO in seconds, as a Go template."""
    text = ""
    for model, slo in by_model.items():
        text += f"{{{{ {'else ' if text else ''}if eq $labels.model {_quoted(model)} }}}}{num(slo)}"
    return f"{text}{{{{ else }}}}{num(default)}{{{{ end }}}}" if text else num(default)


INFERENCE_ALERTS = (
    Alert(
        "LockstepKVCachePressure",
        "warning",
        "5m",
        f"lockstep_inference_kv_cache_usage_ratio > {num(T.KV_CACHE_USAGE_RATIO)}\n"
        "and lockstep_inference_requests_waiting > 0",
        f"KV cache of {label('server')} is full and requests queue",
        f"The {label('engine')} endpoint {label('server')} ({label('model')}) on {WHERE} has used "
        f"{VALUE_PERCENT} of its KV cache for 5 minutes while requests wait for a slot: time to first token "
        "grows with the queue. Add replicas, lower max concurrency or context length, or free GPU memory.",
    ),
    Alert(
        "LockstepKVCachePreemptions",
        "warning",
        "5m",
        f"rate(lockstep_inference_preemptions_total[5m]) * 60 > {num(T.KV_PREEMPTIONS_PER_MINUTE)}",
        f"{label('server')} keeps preempting requests",
        f"The {label('engine')} endpoint {label('server')} ({label('model')}) on {WHERE} preempts "
        f"{VALUE_2F} requests a minute: it runs out of KV cache blocks mid-generation, evicts requests and "
        "recomputes them later, wasting GPU time and inflating their latency.",
    ),
    Alert(
        "LockstepInferenceThroughputDrop",
        "warning",
        "10m",
        f"{TOKENS_RATE}\n"
        f"/ (\n  quantile_over_time({num(T.INFERENCE_THROUGHPUT_BASELINE_QUANTILE)}, "
        f"{TOKENS_RATE}[{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW}])\n  > 0\n)\n"
        f"< {num(T.INFERENCE_THROUGHPUT_DROP_RATIO)}\n"
        "and server:lockstep_inference_requests_waiting:avg5m > 0",
        f"{label('server')} generates far fewer tokens than it did in the last hour",
        f"The {label('engine')} endpoint {label('server')} ({label('model')}) on {WHERE} generates "
        f"{VALUE_PERCENT} of the tokens per second it sustained in the last "
        f"{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW} (5 min rate) while requests wait: it is saturated and "
        "slower than it was, not less busy. A slow or throttled GPU, a stuck worker, preemptions, or a change "
        "of request shapes (longer prompts) or of the engine's settings.",
    ),
    Alert(
        "LockstepInferenceTTFTHigh",
        "warning",
        "10m",
        above_ttft_slo(T.INFERENCE_TTFT_SLO_SECONDS, T.INFERENCE_TTFT_SLO_SECONDS_BY_MODEL),
        f"Time to first token of {label('server')} is above its SLO",
        f"The p95 time to first token of the {label('engine')} endpoint {label('server')} ({label('model')}) "
        f"on {WHERE} is {VALUE_2F} s over 5 minutes, above its SLO of "
        + ttft_slo_text(T.INFERENCE_TTFT_SLO_SECONDS, T.INFERENCE_TTFT_SLO_SECONDS_BY_MODEL)
        + " s, for 10 minutes. Requests wait in its queue (KV cache full, too few replicas) or its prefill "
        "is slow (long prompts, a slow GPU).",
    ),
    Alert(
        "LockstepInferenceErrors",
        "warning",
        "10m",
        f"{FAILED_RATIO} > {num(T.INFERENCE_FAILED_REQUESTS_RATIO)}\n"
        f"and {FINISHED_RATE} * 60 >= {num(T.INFERENCE_MIN_REQUESTS_PER_MINUTE)}",
        f"{label('server')} aborts or fails many requests",
        f"{VALUE_PERCENT} of the requests the {label('engine')} endpoint {label('server')} ({label('model')}) "
        f"on {WHERE} finished in the last 5 minutes were aborted or failed (over "
        f"{percent(T.INFERENCE_FAILED_REQUESTS_RATIO)} for 10 minutes). Aborts are clients or the server "
        "giving up (timeouts while requests queue); errors are the engine failing them. The engine's log "
        "says why.",
    ),
)
