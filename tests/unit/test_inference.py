"""Inference collector against real HTTP servers (127.0.0.1, ephemeral ports) serving each
engine's exposition format, and against a real engine-like process found through /proc.

The exposition texts below are written from the metric names in the engines' documentation
(shared/reference/workloads.md), with values chosen so the normalised result is exact.
"""

from __future__ import annotations

import dataclasses
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lockstep.agent.collector import NothingHere
from lockstep.agent.gpus import GpuInventory, GpuProcess, PublishedGpu
from lockstep.agent.seams import MONOTONIC_CLOCK, Seams
from lockstep.collectors.inference import InferenceCollector, InferenceOptions
from lockstep.collectors.inference.discovery import engine_of
from lockstep.collectors.inference.targets import parse_target, parse_targets
from tests.support import collected, context, free_port, lockstep, samples, wait_until

VLLM = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.75
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 4.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 10.0
vllm:num_requests_running{engine="1",model_name="llama"} 12.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama"} 5.0
vllm:num_preemptions_created{engine="0",model_name="llama"} 1.7e+09
vllm:num_preemptions_total{engine="1",model_name="llama"} 6.0
vllm:num_preemptions_created{engine="1",model_name="llama"} 1.7e+09
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="llama"} 3000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
vllm:prefix_cache_hits_total{engine="1",model_name="llama"} 750.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="llama"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 2.5
vllm:time_to_first_token_seconds_created{engine="0",model_name="llama"} 1.7e+09
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="llama"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="llama"} 5.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="llama"} 5.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="llama"} 3.5
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="llama"} 90.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="llama"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="llama"} 4.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 9.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="llama"} 9.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="llama"} 30.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="llama"} 3.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="llama"} 3.0
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="llama"} 6.5
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="llama"} 8.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 9.0
vllm:request_queue_time_seconds_count{engine="0",model_name="llama"} 9.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="llama"} 1.5
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama"} 5000.0
vllm:prompt_tokens_total{engine="1",model_name="llama"} 7000.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama"} 900.0
vllm:generation_tokens_total{engine="1",model_name="llama"} 1100.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama"} 6.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="llama"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="llama"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="llama"} 1.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="llama"} 0.0
"""

VLLM_OLD = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="opt"} 0.25
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="opt"} 0.0
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="opt"} 64.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="opt"} 16.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.025",model_name="opt"} 7.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="opt"} 8.0
vllm:time_per_output_token_seconds_count{model_name="opt"} 8.0
vllm:time_per_output_token_seconds_sum{model_name="opt"} 0.5
"""

SGLANG = """\
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen"} 0.875
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{model_name="qwen"} 14000.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen"} 9.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 31.0
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{model_name="qwen"} 1.0
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="qwen"} 4.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="qwen"} 600.0
sglang:cached_tokens_total{cache_source="host",model_name="qwen"} 200.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen"} 1600.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="qwen"} 0.5
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.5",model_name="qwen"} 6.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="qwen"} 8.0
sglang:time_to_first_token_seconds_count{model_name="qwen"} 8.0
sglang:time_to_first_token_seconds_sum{model_name="qwen"} 2.25
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_bucket{le="0.02",model_name="qwen"} 30.0
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="qwen"} 32.0
sglang:inter_token_latency_seconds_count{model_name="qwen"} 32.0
sglang:inter_token_latency_seconds_sum{model_name="qwen"} 0.5
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen"} 2400.0
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="qwen"} 8.0
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{model_name="qwen"} 3.0
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="qwen"} 5.0
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="qwen"} 8.0
sglang:e2e_request_latency_seconds_count{model_name="qwen"} 8.0
sglang:e2e_request_latency_seconds_sum{model_name="qwen"} 12.0
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{le="0.1",model_name="qwen"} 7.0
sglang:queue_time_seconds_bucket{le="+Inf",model_name="qwen"} 8.0
sglang:queue_time_seconds_count{model_name="qwen"} 8.0
sglang:queue_time_seconds_sum{model_name="qwen"} 0.25
"""

TGI = """\
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 12000
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 16000
# TYPE tgi_queue_size gauge
tgi_queue_size 2
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 6
# TYPE tgi_request_mean_time_per_token_duration histogram
tgi_request_mean_time_per_token_duration_bucket{le="0.01"} 1
tgi_request_mean_time_per_token_duration_bucket{le="0.05"} 3
tgi_request_mean_time_per_token_duration_bucket{le="+Inf"} 4
tgi_request_mean_time_per_token_duration_sum 0.125
tgi_request_mean_time_per_token_duration_count 4
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="+Inf"} 4
tgi_request_queue_duration_sum 1
tgi_request_queue_duration_count 4
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="2"} 3
tgi_request_duration_bucket{le="+Inf"} 4
tgi_request_duration_sum 5.5
tgi_request_duration_count 4
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="+Inf"} 4
tgi_request_input_length_sum 2048
tgi_request_input_length_count 4
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="+Inf"} 4
tgi_request_generated_tokens_sum 512
tgi_request_generated_tokens_count 4
# TYPE tgi_request_success counter
tgi_request_success 4
# TYPE tgi_request_failure counter
tgi_request_failure{err="validation"} 2
tgi_request_failure{err="generation"} 1
tgi_request_failure{err="dropped"} 5
"""

TRITON = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 2
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 8
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 13
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 300
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 100
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 400
# TYPE nv_inference_count counter
nv_inference_count{model="tensorrt_llm",version="1"} 1200
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="tensorrt_llm",reason="REJECTED",version="1"} 2
nv_inference_request_failure{model="tensorrt_llm",reason="CANCELED",version="1"} 4
nv_inference_request_failure{model="tensorrt_llm",reason="BACKEND",version="1"} 1
nv_inference_request_failure{model="tensorrt_llm",reason="OTHER",version="1"} 0
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{model="tensorrt_llm",version="1"} 9000000
"""

DYNAMO = """\
# TYPE dynamo_frontend_queued_requests gauge
dynamo_frontend_queued_requests{model="qwen"} 7
# TYPE dynamo_frontend_inflight_requests gauge
dynamo_frontend_inflight_requests{model="qwen"} 20
# TYPE dynamo_frontend_time_to_first_token_seconds histogram
dynamo_frontend_time_to_first_token_seconds_bucket{model="qwen",le="0.25"} 10
dynamo_frontend_time_to_first_token_seconds_bucket{model="qwen",le="+Inf"} 12
dynamo_frontend_time_to_first_token_seconds_sum{model="qwen"} 2
dynamo_frontend_time_to_first_token_seconds_count{model="qwen"} 12
# TYPE dynamo_frontend_inter_token_latency_seconds histogram
dynamo_frontend_inter_token_latency_seconds_bucket{model="qwen",le="0.01"} 40
dynamo_frontend_inter_token_latency_seconds_bucket{model="qwen",le="+Inf"} 50
dynamo_frontend_inter_token_latency_seconds_sum{model="qwen"} 0.75
dynamo_frontend_inter_token_latency_seconds_count{model="qwen"} 50
# TYPE dynamo_component_kvstats_active_blocks gauge
dynamo_component_kvstats_active_blocks{dynamo_component="backend",dynamo_namespace="dynamo"} 900
# TYPE dynamo_component_kvstats_total_blocks gauge
dynamo_component_kvstats_total_blocks{dynamo_component="backend",dynamo_namespace="dynamo"} 1000
# TYPE dynamo_component_kvstats_gpu_cache_usage_percent gauge
dynamo_component_kvstats_gpu_cache_usage_percent{dynamo_component="backend",dynamo_namespace="dynamo"} 0.5
# TYPE dynamo_frontend_requests_total counter
dynamo_frontend_requests_total{endpoint="chat_completions",model="qwen",request_type="stream",status="success"} 11
dynamo_frontend_requests_total{endpoint="chat_completions",model="qwen",request_type="stream",status="error"} 1
dynamo_frontend_requests_total{endpoint="completions",model="qwen",request_type="unary",status="error"} 2
# TYPE dynamo_frontend_input_sequence_tokens histogram
dynamo_frontend_input_sequence_tokens_bucket{model="qwen",le="+Inf"} 12
dynamo_frontend_input_sequence_tokens_sum{model="qwen"} 3000
dynamo_frontend_input_sequence_tokens_count{model="qwen"} 12
# TYPE dynamo_frontend_output_sequence_tokens histogram
dynamo_frontend_output_sequence_tokens_bucket{model="qwen",le="+Inf"} 12
dynamo_frontend_output_sequence_tokens_sum{model="qwen"} 600
dynamo_frontend_output_sequence_tokens_count{model="qwen"} 12
# TYPE dynamo_frontend_request_duration_seconds histogram
dynamo_frontend_request_duration_seconds_bucket{model="qwen",le="4"} 9
dynamo_frontend_request_duration_seconds_bucket{model="qwen",le="+Inf"} 12
dynamo_frontend_request_duration_seconds_sum{model="qwen"} 30
dynamo_frontend_request_duration_seconds_count{model="qwen"} 12
"""

DYNAMO_PERCENT = """\
# TYPE dynamo_component_kvstats_gpu_cache_usage_percent gauge
dynamo_component_kvstats_gpu_cache_usage_percent{dynamo_component="backend"} 85
"""


@dataclass
class Page:
    body: str | bytes
    status: int = 200
    delay: float = 0.0  # seconds before answering
    trickle: bool = False  # send the body one byte every 0.1 s


@dataclass
class Engines:
    """A real HTTP server on 127.0.0.1 answering each path with its Page."""

    port: int
    pages: dict[str, Page] = field(default_factory=dict)
    requests: list[dict[str, str]] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def engines() -> Iterator[Engines]:
    release = threading.Event()  # ends slow answers at teardown

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                self.answer()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the collector gave up on a slow answer

        def answer(self) -> None:
            state.requests.append(dict(self.headers))
            page = state.pages.get(self.path, Page("not found", status=404))
            if page.delay:
                release.wait(page.delay)
            body = page.body.encode() if isinstance(page.body, str) else page.body
            self.send_response(page.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if page.trickle:
                for i in range(len(body)):
                    if release.wait(0.1):
                        return
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
            else:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 64  # the default 5 drops concurrent connections for a second
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    server.block_on_close = False  # type: ignore[attr-defined]
    state = Engines(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    release.set()
    server.shutdown()
    server.server_close()


def run(collector: InferenceCollector) -> dict:
    return collected(collector)


def make(*targets: str, timeout: float = 2.0, discover: bool = False, proc: Path | None = None) -> InferenceCollector:
    return InferenceCollector(
        context(
            proc=proc,
            options=InferenceOptions(targets=parse_targets(list(targets)), discover=discover, timeout=timeout),
        )
    )


def series(s: dict, name: str, engine: str, endpoint: str, model: str, **extra: str) -> float:
    return s[(name, frozenset({"engine": engine, "server": endpoint, "model": model, **extra}.items()))]


def test_each_engine_normalised_exactly(engines: Engines) -> None:
    for path, text in {
        "/vllm": VLLM,
        "/vllm-old": VLLM_OLD,
        "/sglang": SGLANG,
        "/tgi": TGI,
        "/triton": TRITON,
        "/dynamo": DYNAMO,
        "/dynamo-percent": DYNAMO_PERCENT,
    }.items():
        engines.pages[path] = Page(text)
    u = engines.url
    collector = make(
        f"vllm={u('/vllm')}",
        f"vllm={u('/vllm-old')}",
        f"sglang={u('/sglang')}",
        f"tgi={u('/tgi')}",
        f"triton={u('/triton')}",
        f"dynamo={u('/dynamo')}",
        f"dynamo={u('/dynamo-percent')}",
    )
    s = run(collector)
    collector.close()

    def v(name: str, engine: str, path: str, model: str, **extra: str) -> float:
        return series(s, f"lockstep_inference_{name}", engine, u(path), model, **extra)

    # vLLM, two data-parallel engine cores: usage is the fuller one; counts and
    # histograms add up; *_created samples are not values.
    assert v("up", "vllm", "/vllm", "llama") == 1
    assert v("kv_cache_usage_ratio", "vllm", "/vllm", "llama") == 0.75
    assert v("requests_waiting", "vllm", "/vllm", "llama") == 7
    assert v("requests_running", "vllm", "/vllm", "llama") == 22
    assert v("preemptions_total", "vllm", "/vllm", "llama") == 11
    assert v("prefix_cache_queries_total", "vllm", "/vllm", "llama") == 4000
    assert v("prefix_cache_hits_total", "vllm", "/vllm", "llama") == 1000
    ttft = "time_to_first_token_seconds"
    assert v(f"{ttft}_bucket", "vllm", "/vllm", "llama", le="0.1") == 3
    assert v(f"{ttft}_bucket", "vllm", "/vllm", "llama", le="1.0") == 7
    assert v(f"{ttft}_bucket", "vllm", "/vllm", "llama", le="+Inf") == 9
    assert v(f"{ttft}_count", "vllm", "/vllm", "llama") == 9
    assert v(f"{ttft}_sum", "vllm", "/vllm", "llama") == 6.0
    itl = "inter_token_latency_seconds"
    assert v(f"{itl}_bucket", "vllm", "/vllm", "llama", le="0.05") == 90
    assert v(f"{itl}_sum", "vllm", "/vllm", "llama") == 4.0
    # older vLLM names
    assert v("kv_cache_usage_ratio", "vllm", "/vllm-old", "opt") == 0.25
    assert v("requests_waiting", "vllm", "/vllm-old", "opt") == 0
    assert v("prefix_cache_queries_total", "vllm", "/vllm-old", "opt") == 64
    assert v("prefix_cache_hits_total", "vllm", "/vllm-old", "opt") == 16
    assert v(f"{itl}_bucket", "vllm", "/vllm-old", "opt", le="0.025") == 7
    assert v(f"{itl}_count", "vllm", "/vllm-old", "opt") == 8
    # SGLang: retractions are preemptions (the counter, not the last batch's gauge);
    # cached tokens of every cache tier are prefix hits, prompt tokens the queries.
    assert v("kv_cache_usage_ratio", "sglang", "/sglang", "qwen") == 0.875
    assert v("requests_waiting", "sglang", "/sglang", "qwen") == 9
    assert v("requests_running", "sglang", "/sglang", "qwen") == 31
    assert v("preemptions_total", "sglang", "/sglang", "qwen") == 4
    assert v("prefix_cache_hits_total", "sglang", "/sglang", "qwen") == 800
    assert v("prefix_cache_queries_total", "sglang", "/sglang", "qwen") == 1600
    assert v(f"{ttft}_bucket", "sglang", "/sglang", "qwen", le="0.5") == 6
    assert v(f"{ttft}_sum", "sglang", "/sglang", "qwen") == 2.25
    assert v(f"{itl}_count", "sglang", "/sglang", "qwen") == 32
    # TGI: batch tokens over the most the batches may hold; no model label.
    assert v("up", "tgi", "/tgi", "") == 1
    assert v("kv_cache_usage_ratio", "tgi", "/tgi", "") == 0.75
    assert v("requests_waiting", "tgi", "/tgi", "") == 2
    assert v("requests_running", "tgi", "/tgi", "") == 6
    # Triton with TensorRT-LLM: used / max blocks; waiting and scheduled requests.
    assert v("kv_cache_usage_ratio", "triton", "/triton", "tensorrt_llm") == 0.75
    assert v("requests_waiting", "triton", "/triton", "tensorrt_llm") == 5
    assert v("requests_running", "triton", "/triton", "tensorrt_llm") == 8
    # Dynamo: the frontend's queue and latency per model; the workers' KV statistics
    # carry no model label. Blocks in use over all blocks wins over the "percent" gauge.
    assert v("requests_waiting", "dynamo", "/dynamo", "qwen") == 7
    # In flight (20) includes the queued (7): running is the rest (issue 28).
    assert v("requests_running", "dynamo", "/dynamo", "qwen") == 13
    assert v(f"{ttft}_bucket", "dynamo", "/dynamo", "qwen", le="0.25") == 10
    assert v(f"{itl}_sum", "dynamo", "/dynamo", "qwen") == 0.75
    assert v("kv_cache_usage_ratio", "dynamo", "/dynamo", "") == 0.9
    assert v("kv_cache_usage_ratio", "dynamo", "/dynamo-percent", "") == 0.85
    # Throughput and latency (issue 15). vLLM: replicas' counters and histograms add up,
    # finished_reason is already Lockstep's reason.
    e2e, queue = "e2e_request_latency_seconds", "request_queue_time_seconds"
    assert v("prompt_tokens_total", "vllm", "/vllm", "llama") == 12000
    assert v("generation_tokens_total", "vllm", "/vllm", "llama") == 2000
    finished = "requests_finished_total"
    assert v(finished, "vllm", "/vllm", "llama", reason="stop") == 8
    assert v(finished, "vllm", "/vllm", "llama", reason="length") == 2
    assert v(finished, "vllm", "/vllm", "llama", reason="abort") == 1
    assert v(finished, "vllm", "/vllm", "llama", reason="error") == 0
    assert v(f"{e2e}_count", "vllm", "/vllm", "llama") == 12
    assert v(f"{e2e}_sum", "vllm", "/vllm", "llama") == 36.5
    assert v(f"{queue}_bucket", "vllm", "/vllm", "llama", le="0.5") == 8
    assert v(f"{queue}_sum", "vllm", "/vllm", "llama") == 1.5
    # SGLang: only aborts have a reason (num_requests_total is not split).
    assert v("prompt_tokens_total", "sglang", "/sglang", "qwen") == 1600
    assert v("generation_tokens_total", "sglang", "/sglang", "qwen") == 2400
    assert v(finished, "sglang", "/sglang", "qwen", reason="abort") == 3
    assert v(f"{e2e}_bucket", "sglang", "/sglang", "qwen", le="1.0") == 5
    assert v(f"{e2e}_sum", "sglang", "/sglang", "qwen") == 12
    assert v(f"{queue}_bucket", "sglang", "/sglang", "qwen", le="0.1") == 7
    assert v(f"{queue}_sum", "sglang", "/sglang", "qwen") == 0.25
    # TGI: tokens are the sums of the per-request length histograms; a dropped request is
    # an abort, other failures errors; its per-request mean time per token is not ITL.
    assert v("prompt_tokens_total", "tgi", "/tgi", "") == 2048
    assert v("generation_tokens_total", "tgi", "/tgi", "") == 512
    assert v(finished, "tgi", "/tgi", "", reason="abort") == 5
    assert v(finished, "tgi", "/tgi", "", reason="error") == 3
    assert v(f"{e2e}_bucket", "tgi", "/tgi", "", le="2.0") == 3
    assert v(f"{e2e}_sum", "tgi", "/tgi", "") == 5.5
    assert v(f"{queue}_count", "tgi", "/tgi", "") == 4
    assert v(f"{queue}_sum", "tgi", "/tgi", "") == 1
    assert not [k for k in s if k[0].startswith(f"lockstep_inference_{itl}") and ("engine", "tgi") in k[1]]
    # Triton: failures by reason, CANCELED an abort; no tokens, no latency histograms (its
    # durations are microsecond counters).
    assert v(finished, "triton", "/triton", "tensorrt_llm", reason="abort") == 4
    assert v(finished, "triton", "/triton", "tensorrt_llm", reason="error") == 3
    # Dynamo: the frontend's token histograms' sums; errored requests of every endpoint.
    assert v("prompt_tokens_total", "dynamo", "/dynamo", "qwen") == 3000
    assert v("generation_tokens_total", "dynamo", "/dynamo", "qwen") == 600
    assert v(finished, "dynamo", "/dynamo", "qwen", reason="error") == 3
    assert v(f"{e2e}_bucket", "dynamo", "/dynamo", "qwen", le="4.0") == 9
    assert v(f"{e2e}_sum", "dynamo", "/dynamo", "qwen") == 30
    # A reason the engine does not tell apart has no series, nor a series it lacks.
    # Engines that count successes without stop or length say "success" (issue 28).
    assert v(finished, "tgi", "/tgi", "", reason="success") == 4
    assert v(finished, "dynamo", "/dynamo", "qwen", reason="success") == 11
    for engine, reasons in {
        "sglang": {"abort"},
        "tgi": {"abort", "error", "success"},
        "triton": {"abort", "error"},
    }.items():
        have = {
            dict(k[1])["reason"] for k in s if k[0] == f"lockstep_inference_{finished}" and ("engine", engine) in k[1]
        }
        assert have == reasons, engine
    for engine in ("triton", "dynamo"):
        assert not [k for k in s if k[0].startswith(f"lockstep_inference_{queue}") and ("engine", engine) in k[1]]
    assert not [k for k in s if k[0].startswith("lockstep_inference_prompt_tokens") and ("engine", "triton") in k[1]]
    # Engines without such metrics get no series rather than a made-up zero.
    assert not [k for k in s if k[0] == "lockstep_inference_preemptions_total" and ("engine", "tgi") in k[1]]
    assert not [k for k in s if "created" in k[0]]


def test_a_bad_target_is_down_and_the_others_are_unaffected(engines: Engines) -> None:
    engines.pages.update(
        {
            "/good": Page(VLLM),
            "/slow": Page(VLLM, delay=30),
            "/trickle": Page(VLLM, trickle=True),
            "/error": Page("internal error", status=500),
            "/garbage": Page(b"\x00\xff{{{ this is not an exposition\n"),
            "/html": Page("<html><body>Welcome</body></html>\n"),
            "/sglang": Page(SGLANG),
        }
    )
    closed = f"http://127.0.0.1:{free_port()}/metrics"
    u = engines.url
    collector = make(
        f"vllm={u('/good')}",
        f"vllm={u('/slow')}",
        f"vllm={u('/trickle')}",
        f"vllm={u('/error')}",
        f"vllm={u('/garbage')}",
        f"vllm={u('/html')}",
        f"vllm={u('/sglang')}",  # an SGLang server configured as vLLM
        f"vllm={closed}",
        timeout=0.5,
    )
    s = run(collector)
    collector.close()
    up = {dict(labels)["server"]: value for (name, labels), value in s.items() if name == "lockstep_inference_up"}
    assert up == {
        u("/good"): 1,
        u("/slow"): 0,
        u("/trickle"): 0,
        u("/error"): 0,
        u("/garbage"): 0,
        u("/html"): 0,
        u("/sglang"): 0,
        closed: 0,
    }
    assert series(s, "lockstep_inference_kv_cache_usage_ratio", "vllm", u("/good"), "llama") == 0.75
    assert series(s, "lockstep_inference_requests_waiting", "vllm", u("/good"), "llama") == 7
    # A down target has its up series only.
    down = {u(p) for p in ("/slow", "/trickle", "/error", "/garbage", "/html", "/sglang")} | {closed}
    assert not [k for k in s if k[0] != "lockstep_inference_up" and dict(k[1]).get("server") in down]


def test_reasons_for_down_targets_reach_the_operator(engines: Engines) -> None:
    engines.pages.update({"/error": Page("boom", status=500), "/sglang": Page(SGLANG), "/slow": Page(VLLM, delay=30)})
    closed = f"http://127.0.0.1:{free_port()}/metrics"
    collector = make(
        f"vllm={engines.url('/error')}",
        f"vllm={engines.url('/sglang')}",
        f"tgi={engines.url('/slow')}",
        f"vllm={closed}",
        timeout=0.5,
    )
    note = collector.check()
    collector.close()
    assert sorted(note.split("; ")) == sorted(
        [
            f"{closed}: connection refused (nothing listens there)",
            f"{engines.url('/error')}: HTTP 500 Internal Server Error",
            f"{engines.url('/sglang')}: no vllm:* metrics in the answer: not a vLLM metrics endpoint?",
            f"{engines.url('/slow')}: no answer within 0.5s",
        ]
    )


def test_a_target_that_goes_down_keeps_its_series_labels(engines: Engines) -> None:
    engines.pages["/vllm"] = Page(VLLM)
    collector = make(f"vllm={engines.url('/vllm')}")
    assert series(run(collector), "lockstep_inference_up", "vllm", engines.url("/vllm"), "llama") == 1
    engines.pages["/vllm"] = Page("gone", status=503)
    s = run(collector)
    collector.close()
    # The series that was 1 is now 0 (same labels), so `up == 0` alerts see it.
    assert [(k, v) for k, v in s.items() if k[0] == "lockstep_inference_up"] == [
        (
            (
                "lockstep_inference_up",
                frozenset({"engine": "vllm", "server": engines.url("/vllm"), "model": "llama"}.items()),
            ),
            0,
        )
    ]


def test_credentials_are_sent_but_never_in_labels(engines: Engines) -> None:
    engines.pages["/metrics"] = Page(TGI)
    target = parse_target(f"tgi=http://scraper:s3cret@127.0.0.1:{engines.port}/")
    assert target.endpoint == f"http://127.0.0.1:{engines.port}/metrics"
    collector = InferenceCollector(context(options=InferenceOptions(targets=(target,), discover=False)))
    s = run(collector)
    collector.close()
    assert series(s, "lockstep_inference_up", "tgi", target.endpoint, "") == 1
    assert engines.requests[-1]["Authorization"] == "Basic c2NyYXBlcjpzM2NyZXQ="  # scraper:s3cret
    assert not [k for k in s if "s3cret" in str(k)]


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("vllm", "expected ENGINE=URL with ENGINE one of vllm, sglang, tgi, triton, dynamo, got 'vllm'"),
        ("ollama=http://x:1", "expected ENGINE=URL with ENGINE one of vllm, sglang, tgi, triton, dynamo"),
        ("vllm=localhost:8000", "'vllm=localhost:8000': expected an http:// or https:// URL with a host"),
        ("vllm=http://h:99999/", "'vllm=http://h:99999/': the port is not a number from 0 to 65535"),
    ],
)
def test_bad_target_is_refused_with_its_reason(given: str, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_target(given)
    assert problem in str(err.value)


def test_targets_from_repeated_flags_end_to_end(engines: Engines) -> None:
    engines.pages.update({"/a": Page(VLLM), "/b": Page(SGLANG)})
    result = lockstep(
        "once",
        "--collector.disable-defaults",
        "--collector.inference",
        "--inference.target",
        f"vllm={engines.url('/a')}",
        "--inference.target",
        f"sglang={engines.url('/b')}",
    )
    assert result.returncode == 0, result.stderr
    s = samples(result.stdout)
    assert series(s, "lockstep_inference_kv_cache_usage_ratio", "vllm", engines.url("/a"), "llama") == 0.75
    assert series(s, "lockstep_inference_kv_cache_usage_ratio", "sglang", engines.url("/b"), "qwen") == 0.875


def test_bad_flag_is_a_usage_error() -> None:
    result = lockstep("once", "--inference.target", "vllm=ftp://x/")
    assert result.returncode == 2
    assert result.stderr == (
        "lockstep: --inference.target: 'vllm=ftp://x/': expected an http:// or https:// URL with a host\n"
    )


def test_nothing_here_without_targets_or_engines(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "stat").write_text("1 (systemd) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100\n")
    with pytest.raises(NothingHere) as err:
        list(InferenceCollector(context(proc=tmp_path, options=InferenceOptions())).collect())
    assert str(err.value).startswith("no inference targets configured (--inference.target ENGINE=URL) and no vLLM")


@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "meta-llama/Llama-3.1-8B"], "vllm"),
        (["vllm", "serve", "m"], "vllm"),
        (["python", "-u", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm"),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
        (["text-generation-launcher", "--model-id", "m"], "tgi"),
        (["/opt/tritonserver/bin/tritonserver", "--model-repository=/models"], "triton"),
        (["python", "-m", "dynamo.frontend", "--http-port", "8000"], "dynamo"),
        (["python", "-m", "dynamo.vllm"], None),  # a Dynamo worker: its frontend is the target
        (["python", "train.py", "--serve"], None),
        (["VLLM::EngineCore"], None),
    ],
)
def test_engine_processes_are_recognised_by_their_command_line(argv: list[str], engine: str | None) -> None:
    assert engine_of(argv) == engine


FAKE_VLLM = """\
#!{python}
# Looks like `vllm serve` to /proc: a console script named vllm, run by the interpreter.
import http.server, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the worker is stopped too
port = int(sys.argv[sys.argv.index("--port") + 1])
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
text = open(sys.argv[sys.argv.index("--metrics-file") + 1], "rb").read()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Handler)
print(worker.pid, flush=True)
try:
    server.serve_forever()
finally:
    worker.kill()
"""


def test_engine_found_from_its_process_and_tied_to_its_pids_and_job(tmp_path: Path) -> None:
    """A real process that looks like vLLM to /proc: found by its command line and its
    listening socket, scraped, and listed with its worker and Slurm job; when it exits,
    it is reported down for a while, then forgotten."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(FAKE_VLLM.format(python=sys.executable))
    script.chmod(0o755)
    (tmp_path / "metrics.txt").write_text(VLLM)
    port = free_port()
    server = subprocess.Popen(
        [str(script), "serve", "llama", "--port", str(port), "--metrics-file", str(tmp_path / "metrics.txt")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLURM_JOB_ID": "777"},
    )
    endpoint = f"http://127.0.0.1:{port}/metrics"
    up = ("lockstep_inference_up", frozenset({"engine": "vllm", "server": endpoint, "model": "llama"}.items()))
    gpu_inventory = GpuInventory()  # what the GPU collector publishes, filled in below
    clock = [1000.0]
    seams = Seams(MONOTONIC_CLOCK.replaced_by(lambda: clock[0]))
    collector = InferenceCollector(
        dataclasses.replace(
            context(proc=Path("/proc"), options=InferenceOptions()), gpu_inventory=gpu_inventory, seams=seams
        )
    )

    def ours(s: dict) -> dict:
        return {k: v for k, v in s.items() if dict(k[1]).get("server") == endpoint}

    def run_or_nothing() -> dict:
        try:
            return run(collector)
        except NothingHere:
            return {}

    worker = 0  # not known until the server says
    try:
        assert server.stdout is not None
        worker = int(server.stdout.readline())
        s = wait_until(lambda: (r := run_or_nothing()).get(up) == 1 and r, timeout=20, step=0.2, what="the fake vLLM")
        assert series(s, "lockstep_inference_kv_cache_usage_ratio", "vllm", endpoint, "llama") == 0.75
        info = sorted(
            (dict(labels)["pid"], dict(labels)["job_id"])
            for (name, labels), _ in s.items()
            if name == "lockstep_inference_process_info" and dict(labels)["server"] == endpoint
        )
        assert info == sorted([(str(server.pid), "777"), (str(worker), "777")])
        # The GPU collector saw the worker on GPU 5: the engine is tied to that GPU.
        gpu_inventory.publish(
            (
                PublishedGpu(4, "GPU-four", "", 4, "", True, (GpuProcess(1, None, None, None),), ()),
                PublishedGpu(5, "GPU-five", "", 5, "", True, (GpuProcess(worker, 1, None, None),), ()),
            )
        )
        s = run(collector)
        tied = {dict(labels)["gpu"] for (name, labels), _ in s.items() if name == "lockstep_inference_gpu_info"}
        assert tied == {"5"}
    finally:
        stop(server, worker)
    clock[0] += 599
    assert ours(run_or_nothing()) == {up: 0}  # gone: down, same labels, no process info
    assert collector.check().find(f"{endpoint}: the vLLM process that served it is gone") >= 0
    clock[0] += 1
    assert ours(run_or_nothing()) == {}
    collector.close()


def test_configured_local_target_is_not_scraped_twice_and_gets_its_processes(tmp_path: Path) -> None:
    """The same server configured as localhost and found by discovery: one target, the
    configured name, with the discovered processes."""
    script = tmp_path / "vllm"
    script.write_text(FAKE_VLLM.format(python=sys.executable))
    script.chmod(0o755)
    (tmp_path / "metrics.txt").write_text(VLLM)
    port = free_port()
    server = subprocess.Popen(
        [str(script), "serve", "llama", "--port", str(port), "--metrics-file", str(tmp_path / "metrics.txt")],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = 0  # not known until the server says
    try:
        assert server.stdout is not None
        worker = int(server.stdout.readline())
        configured = f"http://localhost:{port}/metrics"

        def scraped() -> dict | None:
            collector = InferenceCollector(
                context(proc=Path("/proc"), options=InferenceOptions(targets=parse_targets([f"vllm={configured}"])))
            )
            try:
                s = run(collector)
            finally:
                collector.close()
            return s if any(k[0] == "lockstep_inference_process_info" for k in s) else None

        s = wait_until(scraped, timeout=20, step=0.2, what="the fake vLLM's processes")
        endpoints = {dict(k[1])["server"] for k in s if dict(k[1]).get("engine") == "vllm"}
        ours = {e for e in endpoints if f":{port}/" in e}
        assert ours == {configured}
    finally:
        stop(server, worker)


def stop(server: subprocess.Popen[str], worker: int) -> None:
    """Stop the fake engine; it stops its worker on SIGTERM, so nothing is left behind."""
    server.terminate()
    server.wait(timeout=10)

    def worker_gone() -> bool:
        try:
            return Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    wait_until(worker_gone, what=f"the fake engine's worker {worker} to exit")


def test_scrapes_run_concurrently(engines: Engines) -> None:
    """Eight targets that each take 1 s all answer within one 5 s timeout only if they are
    scraped concurrently (one after another they would need 8 s, and the last ones would be
    reported down)."""
    for i in range(8):
        engines.pages[f"/{i}"] = Page(VLLM, delay=1.0)
    collector = make(*(f"vllm={engines.url(f'/{i}')}" for i in range(8)), timeout=5.0)
    s = run(collector)
    collector.close()
    assert sorted(v for k, v in s.items() if k[0] == "lockstep_inference_up") == [1] * 8
