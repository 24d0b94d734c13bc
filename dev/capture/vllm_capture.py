"""Capture vLLM's /metrics from its own metrics code, fed a known workload (issue 28).

Run by dev/capture-inference with the interpreter of a venv holding the pinned vLLM (no GPU
needed: only vLLM's stat logger and /metrics route run). Not part of Lockstep: it imports
vLLM and prometheus_client only, never lockstep.

What runs is vLLM's: ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py) in prometheus_client's
multiprocess mode, one forked process per API server, as ``vllm serve --api-server-count N``
runs them; each API server's logger is fed ``SchedulerStats``/``IterationStats`` (vLLM's
own classes) for the engine steps it receives; the exposition is what vLLM's own /metrics
route (vllm/entrypoints/serve/instrumentator/metrics.py ``attach_router``, with its HTTP
instrumentator) answers. The vLLM config is a stand-in with only the fields the logger reads
(a real one needs the model's files).

Writes tests/fixtures/inference/vllm-CASE.prom and .json (with the truth: what each
lockstep_inference_* series must read for this workload).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

# Multiprocess mode is chosen when prometheus_client is imported: set the directory first
# (each case then points its processes at a fresh one).
BASE = Path(tempfile.mkdtemp(prefix="lockstep-vllm-capture-"))
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(BASE)

import vllm  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import PlainTextResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from vllm.config import CacheConfig  # noqa: E402
from vllm.entrypoints.serve.instrumentator.metrics import attach_router  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.metrics.loggers import PrometheusStatLogger  # noqa: E402
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats  # noqa: E402
from vllm.v1.spec_decode.metrics import SpecDecodingStats  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OUT = (
    Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "inference"
)


@dataclass
class Step:
    """One engine step as an API server receives it: the engine's scheduler state and this
    step's iteration stats (tokens, latencies, finished requests)."""

    engine: int
    running: int
    waiting: int
    kv_usage: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    preempted: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    finished: list[tuple[str, float, float]] = field(default_factory=list)  # reason, e2e, queued
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class Case:
    name: str
    about: str
    engines: list[int]
    api_servers: list[list[Step]]  # the steps each API server receives, in order
    lora: bool = False
    spec_tokens: int = 0
    connector: bool = False
    rejections: int = 0  # admission rejections (max_num_queued_reqs) at the first API server
    server_errors: int = 0  # HTTP 500 answers of the first API server
    blocks: int = 2048
    block_size: int = 16


def config(case: Case, engine_count: int) -> SimpleNamespace:
    cache = CacheConfig(block_size=case.block_size)
    cache.num_gpu_blocks = case.blocks * engine_count  # the client sums its engines' blocks
    cache.kv_cache_size_tokens = case.blocks * case.block_size  # per engine
    return SimpleNamespace(
        observability_config=SimpleNamespace(
            show_hidden_metrics=False,
            kv_cache_metrics=False,
            custom_histogram_buckets=None,
            cudagraph_metrics=False,
            enable_mfu_metrics=False,
        ),
        model_config=SimpleNamespace(served_model_name=MODEL, max_model_len=8192, is_diffusion=False),
        speculative_config=SimpleNamespace(num_speculative_tokens=case.spec_tokens) if case.spec_tokens else None,
        lora_config=SimpleNamespace(max_loras=4) if case.lora else None,
        kv_transfer_config=None,
        ec_transfer_config=None,
        watermark_config=None,
        cache_config=cache,
        parallel_config=SimpleNamespace(data_parallel_size=engine_count, tensor_parallel_size=1),
    )


REASONS = {str(r): r for r in FinishReason}


def api_server(case: Case, index: int, directory: str, ready: multiprocessing.synchronize.Event) -> None:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    logger = PrometheusStatLogger(config(case, len(case.engines)), case.engines)  # type: ignore[arg-type]
    logger.log_engine_initialized()
    for step in case.api_servers[index]:
        sched = SchedulerStats(
            num_running_reqs=step.running, num_waiting_reqs=step.waiting, kv_cache_usage=step.kv_usage
        )
        sched.prefix_cache_stats = PrefixCacheStats()
        if step.prefix_queries:
            sched.prefix_cache_stats.record(num_tokens=step.prefix_queries, num_hits=step.prefix_hits, preempted=False)
        if case.connector:
            sched.connector_prefix_cache_stats = PrefixCacheStats()
            if step.external_queries:
                sched.connector_prefix_cache_stats.record(
                    num_tokens=step.external_queries, num_hits=step.external_hits, preempted=False
                )
        if case.spec_tokens:
            spec = SpecDecodingStats.new(case.spec_tokens)
            spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens = (
                step.drafts,
                step.draft_tokens,
                step.accepted_tokens,
            )
            sched.spec_decoding_stats = spec
        it = IterationStats()
        it.num_generation_tokens = step.generation_tokens
        it.prompt_token_stats.total = step.prompt_tokens
        it.prompt_token_stats.computed = step.prompt_tokens
        it.num_preempted_reqs = step.preempted
        it.time_to_first_tokens_iter = list(step.ttft)
        it.inter_token_latencies_iter = list(step.itl)
        it.finished_requests = [
            FinishedRequestStats(finish_reason=REASONS[reason], e2e_latency=e2e, queued_time=queued)
            for reason, e2e, queued in step.finished
        ]
        logger.record(scheduler_stats=sched, iteration_stats=it, engine_idx=step.engine)
    if index == 0:
        for _ in range(case.rejections):
            logger.record_admission_rejection("max_num_queued_reqs")
        app = serving_app()
        client = TestClient(app, raise_server_exceptions=False)
        for _ in range(case.server_errors):
            assert client.post("/v1/completions").status_code == 500
        assert client.post("/v1/models").status_code == 200
    ready.set()


def serving_app() -> FastAPI:
    """A FastAPI app with vLLM's own /metrics route and HTTP instrumentator; /v1/completions
    fails as an engine error does (500), /v1/models answers."""
    app = FastAPI()

    @app.post("/v1/completions")
    def completions() -> PlainTextResponse:
        return PlainTextResponse("engine error", status_code=500)

    @app.post("/v1/models")
    def models() -> PlainTextResponse:
        return PlainTextResponse("ok")

    attach_router(app)
    return app


def capture(case: Case) -> str:
    directory = tempfile.mkdtemp(dir=BASE)
    ctx = multiprocessing.get_context("fork")
    for index in range(len(case.api_servers)):
        ready = ctx.Event()
        process = ctx.Process(target=api_server, args=(case, index, directory, ready))
        process.start()
        process.join(300)
        assert process.exitcode == 0, f"{case.name}: API server {index} failed"
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    body = TestClient(serving_app()).get("/metrics").text
    shutil.rmtree(directory)
    return body


def truth(case: Case) -> dict[str, float]:
    """What each lockstep_inference_* series must read: computed from the workload alone."""
    m = f'model="{MODEL}"'
    steps = [s for server in case.api_servers for s in server]
    last = {}
    for s in steps:
        last[s.engine] = s  # gauges: each engine's most recent state
    t: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        t[key] = t.get(key, 0.0) + value

    t[f"lockstep_inference_kv_cache_usage_ratio{{{m}}}"] = max(s.kv_usage for s in last.values())
    t[f"lockstep_inference_requests_running{{{m}}}"] = sum(s.running for s in last.values())
    t[f"lockstep_inference_requests_waiting{{{m}}}"] = sum(s.waiting for s in last.values())
    t[f"lockstep_inference_kv_cache_capacity_tokens{{{m}}}"] = case.blocks * case.block_size * len(case.engines)
    for s in steps:
        add(f"lockstep_inference_preemptions_total{{{m}}}", s.preempted)
        add(f"lockstep_inference_prefix_cache_queries_total{{{m}}}", s.prefix_queries)
        add(
            f"lockstep_inference_prefix_cache_hits_total{{{m}}}",
            s.prefix_hits + (s.external_hits if case.connector else 0),
        )
        add(f"lockstep_inference_prompt_tokens_total{{{m}}}", s.prompt_tokens)
        add(f"lockstep_inference_generation_tokens_total{{{m}}}", s.generation_tokens)
        add(f"lockstep_inference_decode_tokens_total{{{m}}}", s.generation_tokens)
        # vLLM makes the connector's counters at start, connector or not (0 without one).
        add(f"lockstep_inference_prefix_cache_external_hits_total{{{m}}}", s.external_hits if case.connector else 0)
        if case.spec_tokens:
            add(f"lockstep_inference_spec_decode_draft_tokens_total{{{m}}}", s.draft_tokens)
            add(f"lockstep_inference_spec_decode_accepted_tokens_total{{{m}}}", s.accepted_tokens)
    # vLLM creates every finish reason's series at start, so each reason reads (0 if none).
    for reason in REASONS:
        t[f'lockstep_inference_requests_finished_total{{{m},reason="{reason}"}}'] = sum(
            1 for s in steps for r, _, _ in s.finished if r == reason
        )
    t[f"lockstep_inference_requests_rejected_total{{{m}}}"] = case.rejections
    if case.server_errors:  # the instrumentator makes a status's series at its first answer
        t[f"lockstep_inference_http_server_errors_total{{{m}}}"] = case.server_errors
    for name, values in (
        ("time_to_first_token_seconds", [v for s in steps for v in s.ttft]),
        ("inter_token_latency_seconds", [v for s in steps for v in s.itl]),
        ("e2e_request_latency_seconds", [e for s in steps for _, e, _ in s.finished]),
        ("request_queue_time_seconds", [q for s in steps for _, _, q in s.finished]),
    ):
        t[f'lockstep_inference_{name}_bucket{{le="+Inf",{m}}}'] = len(values)
        t[f"lockstep_inference_{name}_count{{{m}}}"] = len(values)
        t[f"lockstep_inference_{name}_sum{{{m}}}"] = sum(values)
    return t


def steps_for(engine: int, scale: int = 1) -> list[Step]:
    """Three steps of one engine: two prefills and a decode with requests ending for every reason."""
    return [
        Step(
            engine,
            running=2,
            waiting=3,
            kv_usage=0.25,
            prompt_tokens=600 * scale,
            generation_tokens=2,
            prefix_queries=600 * scale,
            prefix_hits=200 * scale,
            external_queries=400 * scale,
            external_hits=100 * scale,
            ttft=[0.125, 0.25],
        ),
        Step(
            engine,
            running=4,
            waiting=1,
            kv_usage=0.5,
            prompt_tokens=400,
            generation_tokens=4 * scale,
            prefix_queries=400,
            prefix_hits=0,
            external_queries=400,
            external_hits=0,
            preempted=1,
            ttft=[0.5],
            itl=[0.02] * 4,
            drafts=4,
            draft_tokens=12,
            accepted_tokens=7,
        ),
        Step(
            engine,
            running=3 + engine,
            waiting=engine,
            kv_usage=0.375 + engine / 8,
            generation_tokens=30,
            itl=[0.015625] * 30,
            drafts=10,
            draft_tokens=30,
            accepted_tokens=18,
            finished=[
                ("stop", 1.5, 0.0625),
                ("length", 2.0, 0.125),
                ("abort", 0.5, 0.25),
                ("error", 0.25, 0.0),
                ("repetition", 3.0, 0.0625),
            ],
        ),
    ]


CASES = [
    Case("vllm-single", "one engine core, one API server", [0], [steps_for(0)], rejections=2, server_errors=1),
    Case("vllm-dp2", "data parallelism 2 (two engine cores), one API server", [0, 1], [steps_for(0) + steps_for(1, 2)]),
    Case(
        "vllm-dp2-two-api-servers",
        "data parallelism 2, --api-server-count 2: each API server gets the steps of the requests it owns",
        [0, 1],
        [steps_for(0)[:2] + steps_for(1)[:1], steps_for(1, 2)[1:] + steps_for(0)[2:]],
        server_errors=3,
    ),
    Case(
        "vllm-lora",
        "one engine core with --enable-lora (requests to adapters count under the base model)",
        [0],
        [steps_for(0)],
        lora=True,
    ),
    Case(
        "vllm-spec-decode",
        "speculative decoding (3 draft tokens per step), a KV connector (offloading) serving prefix hits",
        [0],
        [steps_for(0)],
        spec_tokens=3,
        connector=True,
    ),
]


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        body = capture(case)
        (OUT / f"{case.name}.prom").write_text(body)
        meta = {
            "engine": "vllm",
            "source": f"captured: vLLM {vllm.__version__}'s PrometheusStatLogger and /metrics route in "
            f"multiprocess mode ({len(case.api_servers)} API server process(es)), by dev/capture-inference",
            "workload": case.about + "; per engine: 1000 prompt tokens (+ more on engine 1), 3 steps, 5 requests "
            "finishing stop, length, abort, error, repetition",
            "truth": truth(case),
        }
        (OUT / f"{case.name}.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"wrote {case.name}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(BASE, ignore_errors=True)  # the multiprocess files, also after a failure
