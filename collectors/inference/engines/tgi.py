"""TGI (Hugging Face text-generation-inference): its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    Reading,
    Samples,
    finished_by_reason,
    histogram_sums,
    histograms,
    merge,
    per_model,
    ratio,
    readings_by_model,
)


def _reason(labels: dict[str, str]) -> str:
    # tgi_request_failure{err}: "dropped" is the client going away (an abort); validation,
    # overloaded, generation and the others are errors.
    return "abort" if labels.get("err") == "dropped" else "error"


def _failures(s: Samples) -> list[tuple[dict[str, str], float]]:
    # Exposed without _total; the parser names a typed counter's samples with it.
    return s.first("tgi_request_failure", "tgi_request_failure_total")


def normalise(s: Samples) -> dict[str, Reading]:
    # TGI has no KV-cache gauge; the token budget of the running batch over the most the
    # batches may hold (set at warm-up from the memory left for the KV cache) is the proxy.
    return readings_by_model(
        kv_cache_usage=ratio(
            per_model(s.first("tgi_batch_current_max_tokens"), None),
            per_model(s.first("tgi_batch_max_total_tokens"), None),
        ),
        waiting=per_model(s.first("tgi_queue_size"), None),
        running=per_model(s.first("tgi_batch_current_size"), None),
        # No inter-token latency: TGI's tgi_request_mean_time_per_token_duration observes one
        # per-request mean per request, not each gap between tokens, so its quantiles are not
        # those of the other engines' per-token histograms (issue 15); it is not re-exported.
        # TGI counts tokens only as per-request histograms: their sums are the token counters.
        prompt_tokens=histogram_sums(s, "tgi_request_input_length", None),
        generation_tokens=histogram_sums(s, "tgi_request_generated_tokens", None),
        # Successes are not split into stop and length: "success"; failures by their reason.
        finished=merge(
            finished_by_reason(s.first("tgi_request_success", "tgi_request_success_total"), None, lambda _: "success"),
            finished_by_reason(_failures(s), None, _reason),
        ),
        # err="overloaded": refused because --max-concurrent-requests were already in flight.
        rejected=per_model([(lb, v) for lb, v in _failures(s) if lb.get("err") == "overloaded"], None),
        # The most tokens its batches may hold (from the memory left for the KV cache at warm-up).
        kv_capacity_tokens=per_model(s.first("tgi_batch_max_total_tokens"), None),
        e2e_latency=histograms(s, ["tgi_request_duration"], None),
        queue_time=histograms(s, ["tgi_request_queue_duration"], None),
    )
