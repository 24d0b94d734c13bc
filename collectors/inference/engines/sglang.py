"""SGLang: its /metrics read into the normalised Readings.

SGLang's process model (checked against SGLang 0.5.23's own metrics code, the captures in
tests/fixtures/inference/): one tokenizer manager counts requests and tokens (its series have
no rank label; several tokenizer workers are replicas and add up); one scheduler per rank
counts queues, retractions, queue times and per-step tokens, labelled ``tp_rank``,
``pp_rank``, ``moe_ep_rank`` and, with data parallelism, ``dp_rank``.

- ``dp_rank``: replicas, each with its own requests: added up.
- ``tp_rank``, ``pp_rank``, ``moe_ep_rank``: ranks of one replica that run the same batches and
  count the same retractions and queue times: one of them (the lowest rank), never added.
  (Only the first rank logs its gauges unless --enable-metrics-for-all-schedulers; then every
  rank logs the same numbers.)
- ``priority`` on the scheduler's running and waiting gauges: ``""`` is the total, the numbered
  values break it down: the total only. (On the tokenizer's counters each request carries its
  own priority: there the values are parts and add up.)
- ``cache_source`` (device, host, storage tiers) and ``is_streaming``: parts, added up.
"""

from __future__ import annotations

from lockstep.collectors.inference.readings import (
    Reading,
    SampleList,
    Samples,
    finished_by_reason,
    histograms,
    one_copy,
    per_model,
    readings_by_model,
    server_wide,
    totals_only,
)

# Labels of ranks that count the same things (see the module docstring).
COPY_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")
# Cache tiers outside the GPU: SGLang's hierarchical cache (host memory, then storage).
EXTERNAL_TIERS = ("host", "storage")


def _ranks(samples: SampleList) -> SampleList:
    return one_copy(samples, COPY_LABELS)


def _queue(s: Samples, name: str) -> SampleList:
    return totals_only(_ranks(s.first(name)), "priority")


def normalise(s: Samples) -> dict[str, Reading]:
    model = "model_name"
    cached = s.first("sglang:cached_tokens_total")
    decode = [
        (labels, v) for labels, v in _ranks(s.first("sglang:realtime_tokens_total")) if labels.get("mode") == "decode"
    ]
    server_errors = [
        (labels, v)
        for labels, v in s.first("sglang:http_responses_total")
        if labels.get("status_code", "").startswith("5")
    ]
    readings = readings_by_model(
        kv_cache_usage=per_model(_ranks(s.first("sglang:token_usage")), model, max),
        waiting=per_model(_queue(s, "sglang:num_queue_reqs"), model),
        running=per_model(_queue(s, "sglang:num_running_reqs"), model),
        # The counter; sglang:num_retracted_reqs is the last batch's gauge, not a count.
        preemptions=per_model(_ranks(s.first("sglang:num_retracted_requests_total")), model),
        prefix_hits=per_model(cached, model),
        prefix_queries=per_model(s.first("sglang:prompt_tokens_total"), model),
        prefix_external_hits=per_model(
            [(lb, v) for lb, v in cached if lb.get("cache_source") in EXTERNAL_TIERS], model
        ),
        ttft=histograms(s, ["sglang:time_to_first_token_seconds"], model, _ranks),
        itl=histograms(
            s, ["sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"], model, _ranks
        ),
        prompt_tokens=per_model(s.first("sglang:prompt_tokens_total"), model),
        generation_tokens=per_model(s.first("sglang:generation_tokens_total"), model),
        decode_tokens=per_model(decode, model),
        # SGLang counts all requests and the aborted ones, not why the others ended: only
        # "abort" is known (requests_total minus aborts is not stop, it is stop + length).
        finished=finished_by_reason(s.first("sglang:num_aborted_requests_total"), model, lambda _: "abort"),
        e2e_latency=histograms(s, ["sglang:e2e_request_latency_seconds"], model, _ranks),
        queue_time=histograms(s, ["sglang:queue_time_seconds"], model, _ranks),
        kv_capacity_tokens=per_model(_ranks(s.first("sglang:max_total_num_tokens")), model),
    )
    # The HTTP server's answers carry no model label: they are the server's.
    return server_wide(readings, "http_server_errors", sum(v for _, v in server_errors) if server_errors else None)
