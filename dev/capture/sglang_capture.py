"""Capture SGLang's /metrics from its own metrics code, fed a known workload (issue 28).

Run by dev/capture-inference with the interpreter of a venv holding the pinned SGLang (no GPU
needed: only SGLang's metrics collectors and /metrics route run). Not part of Lockstep: it
imports SGLang and prometheus_client only, never lockstep.

What runs is SGLang's: a real ``ServerArgs`` for the case (tp/dp/pp sizes, priority
scheduling, --enable-metrics-for-all-schedulers), published into SGLang's runtime context with
the launcher's rank placement (``SpawnRanks``) in one forked process per scheduler rank, as
the launcher spawns them; each rank builds its collector with ``SchedulerMetricsCollector.init_new``
(SGLang's own rank and label logic: which ranks log their gauges, which labels they carry)
and is fed what the scheduler feeds it: ``log_stats`` where SGLang logs stats, retractions,
queue times and the KV pool's size on every rank, as scheduler.py and req_time_stats.py do.
One tokenizer process builds ``TokenizerMetricsCollector`` with ``tokenizer_metric_labels()``
and observes the finished requests. The exposition is what SGLang's own /metrics route
(``add_prometheus_middleware``) answers over prometheus_client's multiprocess directory.

Writes tests/fixtures/inference/sglang-CASE.prom and .json (with the truth).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
BASE = Path(tempfile.mkdtemp(prefix="lockstep-sglang-capture-"))
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(BASE)

import sglang  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sglang.srt.observability.metrics_collector import (  # noqa: E402
    QueueCount,
    SchedulerMetricsCollector,
    SchedulerStats,
    TokenizerMetricsCollector,
    tokenizer_metric_labels,
)
from sglang.srt.runtime_context import SpawnRanks, get_observability, publish  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.utils.common import add_prometheus_middleware  # noqa: E402

MODEL = "Qwen/Qwen3-8B"
# SGLang resolves its server arguments from the model's config.json (never its weights): a
# local copy of Qwen3-8B's architecture, so nothing is downloaded.
MODEL_DIR = BASE / "model"
MODEL_DIR.mkdir()
(MODEL_DIR / "config.json").write_text(
    json.dumps(
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "vocab_size": 151936,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000,
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        }
    )
)
OUT = (
    Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "inference"
)
KV_TOKENS = 200_000  # the KV pool's size of one replica (max_total_num_tokens)


@dataclass
class Case:
    name: str
    about: str
    tp: int = 1
    dp: int = 1
    pp: int = 1
    priority: bool = False
    all_schedulers: bool = False


def server_args(case: Case) -> ServerArgs:
    return ServerArgs(
        model_path=str(MODEL_DIR),
        served_model_name=MODEL,
        tp_size=case.tp,
        dp_size=case.dp,
        pp_size=case.pp,
        device="cpu",  # no GPU here: only the metrics code runs
        enable_metrics=True,
        enable_priority_scheduling=case.priority,
        enable_metrics_for_all_schedulers=case.all_schedulers,
    )


# The workload of one data-parallel replica (dp rank d): its scheduler's state and what it
# counted; every TP/PP rank of the replica runs the same batches, so sees the same numbers.
def replica(d: int) -> dict:
    return {
        # The priority of each running and each waiting request (one entry per request).
        "running": [5, 1, 7] if d == 0 else [2, 2, 4],
        "waiting": [0, 1, 1] if d == 0 else [3],
        "token_usage": 0.5 + d / 8,
        "retractions": [(2, 300, 40), (1, 100, 10)] if d == 0 else [(3, 450, 60)],
        "queue_times": [0.0625, 0.125, 0.5] if d == 0 else [0.25, 0.25],
        "decode_tokens": 700 + 100 * d,
    }


def scheduler(case: Case, world_rank: int, dp_rank: int | None, directory: str) -> None:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    args = server_args(case)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank, dp_rank=dp_rank))
    context = SchedulerMetricsCollector.init_new(
        server_args=args, enable_priority_scheduling=case.priority, enable_lora=False, enable_hierarchical_cache=False
    )
    collector = context.collector
    assert collector is not None and context.enable_metrics
    work = replica(dp_rank or 0)
    # Scheduler.emit_metrics_constants: every rank, when metrics are on.
    collector.emit_constants(
        max_total_num_tokens=KV_TOKENS,
        max_total_num_tokens_swa=None,
        weight_memory_usage_gb=16.0,
        kv_cache_memory_usage_gb=30.0,
        graph_memory_usage_gb={},
        max_running_requests_under_SLO=None,
        page_size=1,
        num_pages=KV_TOKENS,
        context_len=32768,
        startup_available_gpu_memory_gb=70.0,
    )
    # Scheduler.update_running_batch -> increment_retracted_reqs: every rank (enable_metrics).
    for reqs, input_tokens, output_tokens in work["retractions"]:
        collector.increment_retracted_reqs(reqs, input_tokens, output_tokens)
    # ReqTimeStats.set_forward_entry_time -> observe_queue_time: every rank (enable_metrics).
    for wait in work["queue_times"]:
        collector.observe_queue_time(wait)
    # MetricsReporter: stats only where current_scheduler_metrics_enabled.
    if context.current_scheduler_metrics_enabled:

        def queue(priorities: list[int]) -> QueueCount:
            by_priority: dict[int, int] = {}
            for p in priorities:
                by_priority[p] = by_priority.get(p, 0) + 1
            return QueueCount(total=len(priorities), by_priority=by_priority if case.priority else None)

        stats = SchedulerStats(
            num_running_reqs=queue(work["running"]),
            num_queue_reqs=queue(work["waiting"]),
            token_usage=work["token_usage"],
        )
        collector.log_stats(stats)
        collector.increment_realtime_tokens(None, prefill_compute_tokens=900, decode_tokens=work["decode_tokens"])


# What the tokenizer manager observes: (prompt, generated, cached by tier, e2e, ttft).
FINISHED = [
    (1000, 200, {"device": 400, "host": 100}, 2.0, 0.25),
    (500, 100, {"device": 0, "host": 0}, 1.0, 0.125),
    (300, 50, {"device": 100, "host": 0, "storage": 50}, 0.5, 0.0625),
]
ABORTED = 2


def tokenizer(case: Case, directory: str) -> None:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    args = server_args(case)
    publish(args, role="tokenizer")
    collector = TokenizerMetricsCollector(
        server_args=args,
        labels=tokenizer_metric_labels(),
        bucket_time_to_first_token=get_observability().bucket_time_to_first_token,
        bucket_e2e_request_latency=get_observability().bucket_e2e_request_latency,
        bucket_inter_token_latency=get_observability().bucket_inter_token_latency,
    )
    for i, (prompt, generated, cached, e2e, ttft) in enumerate(FINISHED):
        labels = dict(collector.labels)
        if case.priority:
            labels["priority"] = str(i % 2)  # the request's own priority: parts of the total
        collector.observe_time_to_first_token(labels, ttft, stream=True)
        collector.observe_inter_token_latency(labels, 0.02 * (generated - 1), generated - 1)
        collector.observe_one_finished_request(
            labels, prompt, generated, sum(cached.values()), e2e, False, cached, is_streaming=True
        )
    for _ in range(ABORTED):
        collector.observe_one_aborted_request(collector.labels)


def capture(case: Case) -> str:
    directory = tempfile.mkdtemp(dir=BASE)
    ctx = multiprocessing.get_context("fork")
    jobs = [ctx.Process(target=tokenizer, args=(case, directory))]
    for d in range(case.dp):
        for pp in range(case.pp):
            for tp in range(case.tp):
                dp_rank = d if case.dp > 1 else None
                jobs.append(ctx.Process(target=scheduler, args=(case, case.tp * pp + tp, dp_rank, directory)))
    for job in jobs:
        job.start()
        job.join(300)
        assert job.exitcode == 0, f"{case.name}: a process failed"
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    app = FastAPI()
    add_prometheus_middleware(app)
    body = TestClient(app).get("/metrics").text
    shutil.rmtree(directory)
    return body


def truth(case: Case) -> dict[str, float]:
    m = f'model="{MODEL}"'
    replicas = [replica(d) for d in range(case.dp)]
    t: dict[str, float] = {
        f"lockstep_inference_kv_cache_usage_ratio{{{m}}}": max(r["token_usage"] for r in replicas),
        f"lockstep_inference_requests_running{{{m}}}": sum(len(r["running"]) for r in replicas),
        f"lockstep_inference_requests_waiting{{{m}}}": sum(len(r["waiting"]) for r in replicas),
        f"lockstep_inference_preemptions_total{{{m}}}": sum(n for r in replicas for n, _, _ in r["retractions"]),
        f"lockstep_inference_kv_cache_capacity_tokens{{{m}}}": KV_TOKENS * case.dp,
        f"lockstep_inference_decode_tokens_total{{{m}}}": sum(r["decode_tokens"] for r in replicas),
        f"lockstep_inference_prompt_tokens_total{{{m}}}": sum(f[0] for f in FINISHED),
        f"lockstep_inference_prefix_cache_queries_total{{{m}}}": sum(f[0] for f in FINISHED),
        f"lockstep_inference_generation_tokens_total{{{m}}}": sum(f[1] for f in FINISHED),
        f"lockstep_inference_prefix_cache_hits_total{{{m}}}": sum(sum(f[2].values()) for f in FINISHED),
        f"lockstep_inference_prefix_cache_external_hits_total{{{m}}}": sum(
            f[2].get("host", 0) + f[2].get("storage", 0) for f in FINISHED
        ),
        f'lockstep_inference_requests_finished_total{{{m},reason="abort"}}': ABORTED,
    }
    queue_times = [q for r in replicas for q in r["queue_times"]]
    for name, count, total in (
        ("time_to_first_token_seconds", len(FINISHED), sum(f[4] for f in FINISHED)),
        ("inter_token_latency_seconds", sum(f[1] - 1 for f in FINISHED), sum(0.02 * (f[1] - 1) for f in FINISHED)),
        ("e2e_request_latency_seconds", len(FINISHED), sum(f[3] for f in FINISHED)),
        ("request_queue_time_seconds", len(queue_times), sum(queue_times)),
    ):
        t[f'lockstep_inference_{name}_bucket{{le="+Inf",{m}}}'] = count
        t[f"lockstep_inference_{name}_count{{{m}}}"] = count
        t[f"lockstep_inference_{name}_sum{{{m}}}"] = total
    return t


CASES = [
    Case("sglang-tp2", "tensor parallelism 2: two scheduler ranks of one replica", tp=2),
    Case("sglang-tp8", "tensor parallelism 8", tp=8),
    Case("sglang-dp2", "data parallelism 2: two replicas (dp_rank 0, 1)", dp=2),
    Case("sglang-tp2-dp2", "tensor parallelism 2 x data parallelism 2", tp=2, dp=2),
    Case("sglang-priority", "priority scheduling (--enable-priority-scheduling)", priority=True),
    Case(
        "sglang-all-schedulers",
        "tensor parallelism 2 with --enable-metrics-for-all-schedulers (every rank logs its stats)",
        tp=2,
        all_schedulers=True,
    ),
    Case("sglang-pp2", "pipeline parallelism 2 (two stages of one replica; metrics code only)", pp=2),
]


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[2:])
    for case in CASES:
        if only and case.name not in only:
            continue
        body = capture(case)
        (OUT / f"{case.name}.prom").write_text(body)
        meta = {
            "engine": "sglang",
            "source": f"captured: SGLang {sglang.__version__}'s SchedulerMetricsCollector (one process per scheduler "
            "rank, SGLang's own rank and label logic) and TokenizerMetricsCollector, served by its /metrics route in "
            "multiprocess mode, by dev/capture-inference",
            "workload": case.about + "; 3 finished requests (1800 prompt tokens, 650 cached across tiers, 350 "
            "generated), 2 aborted; per replica its running and waiting requests, retractions and queue times",
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
