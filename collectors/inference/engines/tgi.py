"""TGI (Hugging Face text-generation-inference): its /metrics read into the normalised Readings."""

from __future__ import annotations

from lockstep.collectors.inference.readings import Reading, Samples, histograms, per_model, ratio, readings_by_model


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
        itl=histograms(s, ["tgi_request_mean_time_per_token_duration"], None),
    )
