"""Inference collector against real HTTP servers (127.0.0.1, ephemeral ports) serving each
engine's exposition format, and against a real engine-like process found through /proc.

The engines' expositions (tests/fixtures/inference/written/) are written from the metric names in
the engines' documentation (shared/reference/workloads.md), with values chosen so the normalised
result is exact; hostile engines (trickled headers, huge bodies, values outside their domain,
histograms with bad bounds) are served beside good ones.
"""

from __future__ import annotations

import dataclasses
import http.server
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lockstep.agent.collector import NothingHere
from lockstep.agent.gpus import GpuInventory, GpuProcess, PublishedGpu
from lockstep.agent.samples import safe_label_value
from lockstep.agent.seams import MONOTONIC_CLOCK, Seams
from lockstep.collectors.inference import InferenceCollector, InferenceOptions
from lockstep.collectors.inference.discovery import engine_of
from lockstep.collectors.inference.fetch import INFERENCE_HTTP
from lockstep.collectors.inference.targets import parse_target, parse_targets
from tests.support import (
    FIXTURES,
    collected,
    context,
    free_port,
    lockstep,
    samples,
    wait_until,
)
from tests.support.served import of, self_metric, served

# Each engine's exposition as its documentation names the metrics (shared/reference/workloads.md),
# values chosen so the normalised result is exact: tests/fixtures/inference/written/README.md.
WRITTEN = FIXTURES / "inference" / "written"

VLLM = (WRITTEN / "vllm.prom").read_text()
VLLM_OLD = (WRITTEN / "vllm-old.prom").read_text()  # the names before vLLM V1 (gpu_cache_usage_perc)

SGLANG = (WRITTEN / "sglang.prom").read_text()
TGI = (WRITTEN / "tgi.prom").read_text()
TRITON = (WRITTEN / "triton.prom").read_text()
DYNAMO = (WRITTEN / "dynamo.prom").read_text()

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


@pytest.mark.real
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


@pytest.mark.real
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


@pytest.mark.real
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


@pytest.mark.real
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


# --- inference engines: whole-exchange deadline, bounded body, values in their domain ---

VLLM_GOOD = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 3\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m"} 2\n'
)


class _HostileEngines:
    """A real HTTP endpoint per behaviour: /good, /trickle (headers one byte at a time, for
    ever), /huge (31 MB), /liar (+Inf, negative gauges and counters), /twice (a repeated series)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                path = conn.recv(4096).split(b" ", 2)[1].decode()
                if path == "/trickle":
                    while not self.stop.wait(0.1):
                        conn.sendall(b"H")  # "HHHH..." never ends a status line
                    return
                body = {
                    "/good": VLLM_GOOD,
                    "/huge": "# " + "x" * (31 * 1024 * 1024) + "\n" + VLLM_GOOD,
                    "/liar": (
                        VLLM_GOOD.replace("} 2", "} -5")
                        + "# TYPE vllm:kv_cache_usage_perc gauge\n"
                        + 'vllm:kv_cache_usage_perc{model_name="m"} +Inf\n'
                        + "# TYPE vllm:num_preemptions_total counter\n"
                        + 'vllm:num_preemptions_total{model_name="m"} -100\n'
                    ),
                    "/twice": VLLM_GOOD + 'vllm:num_requests_running{model_name="m"} 4\n',
                }[path].encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            except (OSError, KeyError, IndexError):
                pass

    def close(self) -> None:
        self.stop.set()
        self.listener.shutdown(socket.SHUT_RDWR)  # ends the blocking accept
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def hostile_engines() -> Iterator[_HostileEngines]:
    engines = _HostileEngines()
    yield engines
    engines.close()


def _inference(*targets: str, timeout: float) -> InferenceCollector:
    options = InferenceOptions(targets=parse_targets(list(targets)), discover=False, timeout=timeout)
    return InferenceCollector(context(options=options))


def _engine_up(values: dict, url: str) -> float:
    """lockstep_inference_up of the endpoint (one series per model it served; all agree)."""
    ups = {v for (name, labels), v in values.items() if name == "lockstep_inference_up" and ("server", url) in labels}
    assert len(ups) == 1, ups
    return ups.pop()


def test_a_target_trickling_its_headers_never_starves_the_others(hostile_engines: _HostileEngines) -> None:
    """The timeout covered each socket read, not the whole exchange: every round leaked a
    thread, and after 16 rounds a healthy target reported up 0 and shutdown hung."""
    good, trickle = f"{hostile_engines.url}/good", f"{hostile_engines.url}/trickle"
    # Generous for the healthy target (a thread of this process) on a loaded machine; the
    # trickler is cut at it every round, so it is the test's time: 5 rounds of 2 s.
    collector = _inference(f"vllm={good}", f"vllm={trickle}", timeout=2)
    collected(collector)
    threads_after_one_round = threading.active_count()
    for _ in range(4):  # each of them leaked a thread before
        values = collected(collector)
        assert _engine_up(values, good) == 1
        assert _engine_up(values, trickle) == 0
    wait_until(
        lambda: threading.active_count() <= threads_after_one_round + 2, timeout=10, what="no leaked scrape threads"
    )
    collector.close()


def test_a_31_mb_engine_body_is_refused(hostile_engines: _HostileEngines, caplog: pytest.LogCaptureFixture) -> None:
    huge, good = f"{hostile_engines.url}/huge", f"{hostile_engines.url}/good"
    collector = _inference(f"vllm={huge}", f"vllm={good}", timeout=30)
    with caplog.at_level(logging.WARNING):
        values = collected(collector)
    assert _engine_up(values, huge) == 0 and _engine_up(values, good) == 1
    assert any(r.getMessage() == "inference target down: answer larger than 4 MiB" for r in caplog.records)
    collector.close()


def test_engine_values_outside_their_domain_are_left_out(
    hostile_engines: _HostileEngines, caplog: pytest.LogCaptureFixture
) -> None:
    liar, twice = f"{hostile_engines.url}/liar", f"{hostile_engines.url}/twice"
    collector = _inference(f"vllm={liar}", f"vllm={twice}", timeout=30)
    with caplog.at_level(logging.WARNING):
        values = collected(collector)
        collected(collector)  # the same values again: not logged again
    labels = {("engine", "vllm"), ("server", liar), ("model", "m")}
    assert values[("lockstep_inference_requests_running", frozenset(labels))] == 3
    assert ("lockstep_inference_requests_waiting", frozenset(labels)) not in values  # -5
    assert ("lockstep_inference_kv_cache_usage_ratio", frozenset(labels)) not in values  # +Inf
    assert ("lockstep_inference_preemptions_total", frozenset(labels)) not in values  # -100
    assert _engine_up(values, twice) == 0  # a repeated series is not summed into a made-up value
    messages = [r.getMessage() for r in caplog.records]
    example = 'vllm:num_preemptions_total{model_name="m"} = -100'
    assert messages.count(f"left out 3 values outside their domain, e.g. {example}") == 1
    twice_message = 'series vllm:num_requests_running{model_name="m"} appears twice: not valid exposition'
    assert f"inference target down: {twice_message}" in messages
    collector.close()


def _vllm_body(model: str, running: int) -> str:
    return f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="{model}"}} {running}\n'


def test_a_model_name_over_the_cap_keeps_its_targets_up(tmp_path: Path) -> None:
    long_model = "m" * 5000
    bodies = {
        "http://127.0.0.1:9001/metrics": _vllm_body(long_model, 4),
        "http://127.0.0.1:9002/metrics": _vllm_body("small", 2),
    }
    targets = parse_targets(["vllm=http://127.0.0.1:9001/metrics", "vllm=http://127.0.0.1:9002/metrics"])
    collector = InferenceCollector(
        dataclasses.replace(
            context(proc=tmp_path, options=InferenceOptions(targets=targets, discover=False)),
            seams=Seams(INFERENCE_HTTP.replaced_by(lambda url, timeout: bodies[url])),
        )
    )
    try:
        result = served(collector)
    finally:
        collector.close()
    cut = safe_label_value(long_model)
    for values in (result.text, result.openmetrics):
        long_labels = {"engine": "vllm", "server": "http://127.0.0.1:9001/metrics", "model": cut}
        assert of(values, "lockstep_inference_up", **long_labels) == 1  # was absent: the target vanished
        assert of(values, "lockstep_inference_requests_running", **long_labels) == 4
        small = {"engine": "vllm", "server": "http://127.0.0.1:9002/metrics", "model": "small"}
        assert of(values, "lockstep_inference_up", **small) == 1
        assert of(values, "lockstep_inference_requests_running", **small) == 2
    assert self_metric(result, "altered_label_values_total", "inference") == 2
    assert self_metric(result, "rejected_samples_total", "inference") == 0


# --- item 11: engine histograms with bounds that are no histogram's ---


def _ttft(model: str, buckets: list[tuple[str, float]], count: float, total: float) -> str:
    lines = [f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="{model}"}} {n}' for le, n in buckets]
    lines.append(f'vllm:time_to_first_token_seconds_count{{model_name="{model}"}} {count}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{model_name="{model}"}} {total}')
    return "\n".join(lines) + "\n"


# One model per defect, each next to nothing else; "good" is a valid histogram.
HISTOGRAMS = {
    "good": [("0.1", 1), ("1.0", 3), ("+Inf", 5)],
    "nan": [("0.1", 1), ("NaN", 3), ("+Inf", 5)],
    "minus-inf": [("-Inf", 0), ("1.0", 3), ("+Inf", 5)],
    "alias": [("1", 5), ("1.0", 5), ("+Inf", 5)],  # the same bucket twice: was added up to 10
    "alias-inf": [("1.0", 3), ("1e400", 5), ("+Inf", 5)],  # 1e400 is +Inf as a float
    "decreasing": [("0.1", 4), ("1.0", 2), ("+Inf", 5)],
    "no-inf": [("0.1", 1), ("1.0", 3)],
}


def test_engine_histograms_with_bad_bounds_are_refused_and_the_output_stays_valid(tmp_path: Path) -> None:
    body = "# TYPE vllm:time_to_first_token_seconds histogram\n" + "".join(
        _ttft(model, buckets, 5, 2.5) for model, buckets in HISTOGRAMS.items()
    )
    body += "".join(f'vllm:num_requests_running{{model_name="{model}"}} 1\n' for model in HISTOGRAMS)
    endpoint = "http://127.0.0.1:9001/metrics"
    collector = InferenceCollector(
        dataclasses.replace(
            context(
                proc=tmp_path, options=InferenceOptions(targets=parse_targets([f"vllm={endpoint}"]), discover=False)
            ),
            seams=Seams(INFERENCE_HTTP.replaced_by(lambda url, timeout: body)),
        )
    )
    try:
        result = served(collector)  # served() parses the OpenMetrics rendering: it raised before
    finally:
        collector.close()
    name = "lockstep_inference_time_to_first_token_seconds"
    for values in (result.text, result.openmetrics):
        good = {"engine": "vllm", "server": endpoint, "model": "good"}
        assert {
            labels["le"]: v
            for (n, ls), v in values.items()
            if n == f"{name}_bucket" and (labels := dict(ls))["model"] == "good"
        } == {"0.1": 1, "1.0": 3, "+Inf": 5}
        assert of(values, f"{name}_count", **good) == 5
        assert of(values, f"{name}_sum", **good) == 2.5
        histogram_models = {dict(ls)["model"] for n, ls in values if n.startswith(name)}
        assert histogram_models == {"good"}
        for model in HISTOGRAMS:  # the rest of each model's data stays
            assert of(values, "lockstep_inference_up", engine="vllm", server=endpoint, model=model) == 1
    assert of(result.text, "lockstep_inference_skipped_values_total", engine="vllm", server=endpoint) == 6
