"""Inference collector: KV-cache pressure, queues, preemptions and latency of the
inference engines on this node, from each engine's own /metrics, in one vocabulary.

Targets are the configured ones (``--inference.target ENGINE=URL``, repeatable, or
``collectors.inference.targets``) plus the engines found running on this node: processes
whose command line is a vLLM, SGLang, TGI, Triton or Dynamo server, and the TCP port each
listens on (procfs: /proc/PID/cmdline, /proc/PID/fd, /proc/PID/net/tcp{,6}).

Each round scrapes every target concurrently (bounded thread pool), each with its own
timeout; the answer is parsed with prometheus_client's parser and normalised
(``ENGINE_FORMATS`` below; docs/workloads.md has the table).  A target that is down,
slow, answers with an error or with something that is not its engine's exposition gets
``lockstep_inference_up 0``; the other targets are unaffected.

Engine-to-GPU and engine-to-job ties are an info series,
``lockstep_inference_process_info{engine,endpoint,pid,job_id}``: the engine's server
process and every process below it (its workers hold the GPU contexts), each with the
Slurm job it runs in.  The GPUs are those whose NVML compute-process list (the GPU
collector's) holds one of these pids: the seam is the pid.

Fakes: ``context.seams.inference_http``, a callable ``(url, timeout) -> str`` raising
ScrapeError or OSError, replaces HTTP (the simulated node serves its engines that way).
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import math
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from lockstep import __version__
from lockstep.agent import gpus
from lockstep.agent.collector import Collector, CollectorContext, MetricSpec, NothingHere, Option, describe_error
from lockstep.agent.config import parse_bool, parse_duration, parse_string_list
from lockstep.agent.procs import (
    Process,
    cmdline,
    descendants,
    listening_sockets,
    process_table,
    same_network_namespace,
    slurm_job,
)

LABELS = ("engine", "endpoint", "model")

UP = MetricSpec(
    "lockstep_inference_up",
    "gauge",
    "1 when the engine's /metrics answered with its metrics in time, 0 when it is down, slow, "
    "answered with an error or with something else.",
    LABELS,
)
KV_CACHE_USAGE = MetricSpec(
    "lockstep_inference_kv_cache_usage_ratio",
    "gauge",
    "Share of the engine's KV cache in use (0..1); near 1 the engine preempts requests and latency "
    "climbs. The most loaded of the engine's data-parallel replicas.",
    LABELS,
    unit="ratio",
)
REQUESTS_WAITING = MetricSpec(
    "lockstep_inference_requests_waiting", "gauge", "Requests queued, not yet scheduled.", LABELS
)
REQUESTS_RUNNING = MetricSpec(
    "lockstep_inference_requests_running", "gauge", "Requests being processed (in the running batch).", LABELS
)
PREEMPTIONS = MetricSpec(
    "lockstep_inference_preemptions_total",
    "counter",
    "Requests preempted for lack of KV cache (vLLM preemptions, SGLang retractions).",
    LABELS,
)
PREFIX_HITS = MetricSpec(
    "lockstep_inference_prefix_cache_hits_total",
    "counter",
    "Prompt tokens served from the prefix cache.",
    LABELS,
)
PREFIX_QUERIES = MetricSpec(
    "lockstep_inference_prefix_cache_queries_total",
    "counter",
    "Prompt tokens looked up in the prefix cache (hit ratio: rate(hits) / rate(queries)).",
    LABELS,
)
TTFT = MetricSpec(
    "lockstep_inference_time_to_first_token_seconds",
    "histogram",
    "Time to first token, the engine's own histogram re-exported.",
    LABELS,
    unit="seconds",
)
ITL = MetricSpec(
    "lockstep_inference_inter_token_latency_seconds",
    "histogram",
    "Time between output tokens, the engine's own histogram re-exported (TGI: per-request mean).",
    LABELS,
    unit="seconds",
)
PROCESS_INFO = MetricSpec(
    "lockstep_inference_process_info",
    "gauge",
    "A process of a local engine (its server and every process below it), with the Slurm job it runs "
    'in ("" if none); the engine\'s GPUs are those whose NVML compute-process list has one of these pids. Always 1.',
    ("engine", "endpoint", "pid", "job_id"),
)

GPU_INFO = MetricSpec(
    "lockstep_inference_gpu_info",
    "gauge",
    "A GPU a local engine runs on (one of the engine's processes is in the GPU's NVML compute-process "
    "list); gpu is the NVML index as on lockstep_gpu_* series. Always 1.",
    ("engine", "endpoint", "gpu", "uuid"),
)

DEFAULT_TIMEOUT = 3.0
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_SCRAPE_THREADS = 16
# How long a discovered engine whose process is gone is still reported (up 0).
GONE_ENGINE_SECONDS = 600.0


class ScrapeError(Exception):
    """Why a target gave no usable answer, in words for the operator."""


# --- engines: how to recognise their processes, and how to read their metrics ---


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    sum: float = 0.0


@dataclass
class Reading:
    """One model's normalised values; None where the engine has no such metric."""

    kv_cache_usage: float | None = None
    waiting: float | None = None
    running: float | None = None
    preemptions: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None


class Samples:
    """An exposition's samples by name.  ``*_created`` samples (creation times that
    OpenMetrics-style exporters put next to counters and histograms) are not data."""

    def __init__(self, text: str) -> None:
        self.by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if not sample.name.endswith("_created"):
                        self.by_name[sample.name].append((sample.labels, sample.value))
        except (ValueError, TypeError, IndexError) as exc:
            raise ScrapeError(f"not Prometheus text exposition: {exc}") from None

    def first(self, *names: str) -> list[tuple[dict[str, str], float]]:
        """The samples of the first of ``names`` present (current name, then older ones)."""
        for name in names:
            if name in self.by_name:
                return self.by_name[name]
        return []

    def where(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(have, v) for have, v in self.by_name.get(name, []) if all(have.get(k) == x for k, x in labels.items())]

    def has_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.by_name)


def per_model(
    samples: Iterable[tuple[dict[str, str], float]], model_label: str | None, combine: Callable[..., float] = sum
) -> dict[str, float]:
    """Values by model ("" when the engine has no model label), NaNs dropped; series of
    one model (data-parallel replicas, other labels) combined with ``combine``."""
    groups: dict[str, list[float]] = defaultdict(list)
    for labels, value in samples:
        if not math.isnan(value):
            groups[labels.get(model_label, "") if model_label else ""].append(value)
    return {model: combine(values) for model, values in groups.items()}


def histograms(s: Samples, names: Sequence[str], model_label: str | None) -> dict[str, Histogram]:
    """The first present histogram of ``names``, per model, replicas' buckets added up."""
    for name in names:
        buckets = s.by_name.get(f"{name}_bucket")
        if buckets:
            break
    else:
        return {}
    found: dict[str, Histogram] = defaultdict(Histogram)
    for labels, value in buckets:
        try:
            bound = float(labels["le"])
        except (KeyError, ValueError):
            continue
        model = labels.get(model_label, "") if model_label else ""
        h = found[model]
        h.buckets[bound] = h.buckets.get(bound, 0.0) + value
    for model, total in per_model(s.by_name.get(f"{name}_sum", []), model_label).items():
        if model in found:
            found[model].sum = total
    return {model: h for model, h in found.items() if math.inf in h.buckets}


def ratio(numerator: dict[str, float], denominator: dict[str, float]) -> dict[str, float]:
    return {m: numerator[m] / denominator[m] for m in numerator if denominator.get(m, 0) > 0}


def _vllm(s: Samples) -> dict[str, Reading]:
    model = "model_name"
    return _readings(
        kv_cache_usage=per_model(s.first("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), model, max),
        waiting=per_model(s.first("vllm:num_requests_waiting"), model),
        running=per_model(s.first("vllm:num_requests_running"), model),
        preemptions=per_model(s.first("vllm:num_preemptions_total"), model),
        prefix_hits=per_model(s.first("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), model),
        prefix_queries=per_model(
            s.first("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"), model
        ),
        ttft=histograms(s, ["vllm:time_to_first_token_seconds"], model),
        itl=histograms(s, ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"], model),
    )


def _sglang(s: Samples) -> dict[str, Reading]:
    model = "model_name"
    return _readings(
        kv_cache_usage=per_model(s.first("sglang:token_usage"), model, max),
        waiting=per_model(s.first("sglang:num_queue_reqs"), model),
        running=per_model(s.first("sglang:num_running_reqs"), model),
        # The counter; sglang:num_retracted_reqs is the last batch's gauge, not a count.
        preemptions=per_model(s.first("sglang:num_retracted_requests_total"), model),
        prefix_hits=per_model(s.first("sglang:cached_tokens_total"), model),
        prefix_queries=per_model(s.first("sglang:prompt_tokens_total"), model),
        ttft=histograms(s, ["sglang:time_to_first_token_seconds"], model),
        itl=histograms(s, ["sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"], model),
    )


def _tgi(s: Samples) -> dict[str, Reading]:
    # TGI has no KV-cache gauge; the token budget of the running batch over the most the
    # batches may hold (set at warm-up from the memory left for the KV cache) is the proxy.
    return _readings(
        kv_cache_usage=ratio(
            per_model(s.first("tgi_batch_current_max_tokens"), None),
            per_model(s.first("tgi_batch_max_total_tokens"), None),
        ),
        waiting=per_model(s.first("tgi_queue_size"), None),
        running=per_model(s.first("tgi_batch_current_size"), None),
        itl=histograms(s, ["tgi_request_mean_time_per_token_duration"], None),
    )


def _triton(s: Samples) -> dict[str, Reading]:
    model = "model"
    blocks = "nv_trt_llm_kv_cache_block_metrics"
    usage = ratio(
        per_model(s.where(blocks, kv_cache_block_type="used"), model),
        per_model(s.where(blocks, kv_cache_block_type="max"), model),
    )
    for name, fraction in per_model(s.where(blocks, kv_cache_block_type="fraction"), model, max).items():
        usage.setdefault(name, fraction)
    return _readings(
        kv_cache_usage=usage,
        waiting=per_model(s.where("nv_trt_llm_request_metrics", request_type="waiting"), model),
        running=per_model(s.where("nv_trt_llm_request_metrics", request_type="scheduled"), model),
    )


def _dynamo(s: Samples) -> dict[str, Reading]:
    model = "model"
    usage = ratio(
        per_model(s.first("dynamo_component_kvstats_active_blocks"), model),
        per_model(s.first("dynamo_component_kvstats_total_blocks"), model),
    )
    # Named "percent", documented by Dynamo as 0.0-1.0: read as a fraction, and as a
    # percentage (divided by 100) only when it is above 1.
    for name, value in per_model(s.first("dynamo_component_kvstats_gpu_cache_usage_percent"), model, max).items():
        usage.setdefault(name, value / 100.0 if value > 1.0 else value)
    return _readings(
        kv_cache_usage=usage,
        waiting=per_model(s.first("dynamo_frontend_queued_requests"), model),
        running=per_model(s.first("dynamo_frontend_inflight_requests"), model),
        ttft=histograms(s, ["dynamo_frontend_time_to_first_token_seconds"], model),
        itl=histograms(s, ["dynamo_frontend_inter_token_latency_seconds"], model),
    )


def _readings(**fields: dict[str, Any]) -> dict[str, Reading]:
    readings: dict[str, Reading] = {}
    for name, values in fields.items():
        for model, value in values.items():
            if name == "kv_cache_usage":
                value = min(1.0, max(0.0, value))
            setattr(readings.setdefault(model, Reading()), name, value)
    return readings


@dataclass(frozen=True)
class EngineFormat:
    name: str
    title: str
    prefix: str  # every metric of the engine starts with it: the answer is this engine's
    normalise: Callable[[Samples], dict[str, Reading]]
    default_port: int
    port_flags: tuple[str, ...]  # command-line flags that set the metrics port


ENGINE_FORMATS = {
    e.name: e
    for e in (
        EngineFormat("vllm", "vLLM", "vllm:", _vllm, 8000, ("--port",)),
        EngineFormat("sglang", "SGLang", "sglang:", _sglang, 30000, ("--port",)),
        EngineFormat("tgi", "TGI", "tgi_", _tgi, 3000, ("--port",)),
        EngineFormat("triton", "Triton (TensorRT-LLM)", "nv_", _triton, 8002, ("--metrics-port",)),
        EngineFormat("dynamo", "Dynamo", "dynamo_", _dynamo, 8000, ("--http-port",)),
    )
}

# Processes worth reading the command line of (kernel command names, 15 characters).
_CANDIDATE_COMM = re.compile(r"python|vllm|sglang|triton|text-gen|dynamo|pt_main|uvicorn", re.IGNORECASE)


def engine_of(argv: Sequence[str]) -> str | None:
    """The engine a command line starts, or None.

    Console scripts (``vllm serve``) run as ``/usr/bin/python3 /usr/local/bin/vllm serve ...``;
    modules as ``python -m vllm.entrypoints.openai.api_server``; binaries as themselves.
    """
    if not argv:
        return None
    program = argv[0].rsplit("/", 1)[-1]
    if program.startswith("python"):
        args = list(argv[1:])
        while args and args[0].startswith("-") and args[0] != "-m":  # interpreter options
            args = args[2:] if args[0] in ("-X", "-W") else args[1:]
        if len(args) >= 2 and args[0] == "-m":
            return _MODULES.get(args[1])
        return engine_of(args)  # a script: look at it as the program
    if program == "vllm" and argv[1:2] == ["serve"]:
        return "vllm"
    if program == "api_server.py" and "/vllm/entrypoints/" in argv[0]:
        return "vllm"
    if program == "tritonserver":
        return "triton"
    if program in ("text-generation-launcher", "text-generation-router"):
        return "tgi"
    return None


_MODULES = {
    "vllm.entrypoints.openai.api_server": "vllm",
    "vllm.entrypoints.api_server": "vllm",
    "vllm.entrypoints.cli.main": "vllm",
    "sglang.launch_server": "sglang",
    "dynamo.frontend": "dynamo",
}


def _flag_value(argv: Sequence[str], flags: Sequence[str]) -> int | None:
    """The number given to one of ``flags`` (``--port 8000`` or ``--port=8000``)."""
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg.startswith(flag + "="):
                value = arg[len(flag) + 1 :]
            elif arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            else:
                continue
            if value.isdigit():
                return int(value)
    return None


# --- targets ---


@dataclass(frozen=True)
class Target:
    engine: str
    url: str  # what is fetched (may carry credentials)
    endpoint: str  # the label: scheme://host:port/path, without credentials or query


def parse_target(text: str) -> Target:
    engine, sep, url = text.partition("=")
    engine, url = engine.strip().lower(), url.strip()
    if not sep or engine not in ENGINE_FORMATS:
        raise ValueError(f"expected ENGINE=URL with ENGINE one of {', '.join(ENGINE_FORMATS)}, got {text!r}")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number from 0 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r}: expected an http:// or https:// URL with a host")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{port}" if port is not None else host
    return Target(
        engine,
        urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")),
        urlunsplit((parts.scheme, netloc, path, "", "")),
    )


def parse_targets(value: Any) -> tuple[Target, ...]:
    targets: dict[str, Target] = {}
    for text in parse_string_list(value):
        target = parse_target(text)
        targets.setdefault(target.endpoint, target)
    return tuple(targets.values())


@dataclass(frozen=True)
class LocalEngine:
    """An engine server found among this node's processes."""

    engine: str
    pid: int  # the process listening on the port
    root: int  # the engine's topmost process (e.g. TGI's launcher above its router)
    host: str  # the address to reach it at from here
    port: int


def _local_host(host: str) -> bool:
    """Whether a URL's host is this node as seen from itself."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


# --- HTTP ---


def fetch_http(url: str, timeout: float) -> str:
    """GET url; the text, or ScrapeError saying why not.

    http.client rather than urllib: no proxy from the environment (the target is on this
    node), and the whole answer, not each socket operation, is bounded by ``timeout``.
    """
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    headers = {"Accept": "text/plain;version=0.0.4", "User-Agent": f"lockstep/{__version__}"}
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode()
    try:
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        sock = connection.sock  # getresponse may drop the connection's reference to it
        response = connection.getresponse()
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status} {response.reason}".rstrip())
        body = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ScrapeError(f"no complete answer within {timeout:g}s")
            if sock is not None:
                sock.settimeout(remaining)
            chunk = response.read1(65536)
            if not chunk:
                break
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ScrapeError(f"answer larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        return body.decode("utf-8", "replace")
    except TimeoutError:
        raise ScrapeError(f"no answer within {timeout:g}s") from None
    except ConnectionRefusedError:
        raise ScrapeError("connection refused (nothing listens there)") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ScrapeError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
    finally:
        connection.close()


@dataclass
class Result:
    target: Target
    readings: dict[str, Reading] | None  # None: down
    error: str = ""


class InferenceCollector(Collector):
    name = "inference"
    help = "KV-cache usage, queues, preemptions and latency of vLLM, SGLang, TGI, Triton and Dynamo servers."
    default_interval = 15.0
    metrics = (
        UP,
        KV_CACHE_USAGE,
        REQUESTS_WAITING,
        REQUESTS_RUNNING,
        PREEMPTIONS,
        PREFIX_HITS,
        PREFIX_QUERIES,
        TTFT,
        ITL,
        PROCESS_INFO,
        GPU_INFO,
    )
    needs = ("gpu",)  # the GPU inventory (agent/gpus.py) says which GPUs run the engines' processes
    options = (
        Option(
            "targets",
            parse_targets,
            (),
            "an engine's metrics endpoint as ENGINE=URL, ENGINE one of " + ", ".join(ENGINE_FORMATS),
            flag="--inference.target",
            repeatable=True,
        ),
        Option("discover", parse_bool, True, "also scrape the engines found among this node's processes"),
        Option("timeout", parse_duration, DEFAULT_TIMEOUT, "how long one target may take to answer"),
    )

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.configured: tuple[Target, ...] = tuple(context.options.get("targets", ()))
        self.discover = bool(context.options.get("discover", True))
        self.timeout = float(context.options.get("timeout", DEFAULT_TIMEOUT))
        self.fetch: Callable[[str, float], str] = context.seams.inference_http or fetch_http
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._models: dict[str, list[str]] = {}  # endpoint -> models of its last good answer
        self._down: dict[str, str] = {}  # endpoint -> why, for logging changes once
        # Discovered endpoints -> (target, when a process last served it), monotonic clock.
        self._discovered: dict[str, tuple[Target, float]] = {}
        self.clock = time.monotonic  # tests replace it
        self._quiet = False
        self.notes: list[str] = []  # what discovery could not do, for doctor

    def check(self) -> str:
        self._quiet = True  # doctor prints the reasons itself
        try:
            results = self._round()[0]
        finally:
            self._quiet = False
        down = [f"{r.target.endpoint}: {r.error}" for r in results if r.readings is None]
        return "; ".join(down + self.notes)

    def collect(self) -> Iterator[Metric]:
        results, engines, table = self._round()
        return iter(self._families(results, engines, table))

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    # --- one round ---

    def _round(self) -> tuple[list[Result], dict[str, LocalEngine], dict[int, Process]]:
        self.notes = []
        table = process_table(self.paths.procfs) if self.discover else {}
        local = self._local_engines(table) if table else []
        targets = list(self.configured)
        engines: dict[str, LocalEngine] = {}  # endpoint -> the local process serving it
        for target in self.configured:
            parts = urlsplit(target.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            for engine in local:
                if _local_host(parts.hostname or "") and engine.port == port:
                    engines[target.endpoint] = engine
        served = {(e.pid, e.port) for e in engines.values()}
        for engine in local:
            if (engine.pid, engine.port) in served:
                continue  # configured explicitly: not again under another name
            host = f"[{engine.host}]" if ":" in engine.host else engine.host
            url = f"http://{host}:{engine.port}/metrics"
            target = Target(engine.engine, url=url, endpoint=url)
            targets.append(target)
            engines[target.endpoint] = engine
        # A discovered engine whose process is gone (crashed, stopped) stays, down, for a
        # while: `up == 0` should see it rather than the series just vanishing.
        now = self.clock()
        for endpoint in engines:
            self._discovered[endpoint] = (next(t for t in targets if t.endpoint == endpoint), now)
        gone = []
        for endpoint, (target, seen) in list(self._discovered.items()):
            if endpoint in engines:
                continue
            if now - seen >= GONE_ENGINE_SECONDS or target in self.configured:
                del self._discovered[endpoint]
                continue
            title = ENGINE_FORMATS[target.engine].title
            gone.append(Result(target, None, f"the {title} process that served it is gone"))
        if not targets and not gone:
            raise NothingHere(
                "no inference targets configured (--inference.target ENGINE=URL) and no "
                + ", ".join(e.title for e in ENGINE_FORMATS.values())
                + " server found among this node's processes"
                + (f" ({'; '.join(self.notes)})" if self.notes else "")
            )
        for result in gone:
            self._log_change(result)
        results = sorted(self._scrape_all(targets) + gone, key=lambda r: (r.target.engine, r.target.endpoint))
        return results, engines, table

    def _local_engines(self, table: dict[int, Process]) -> list[LocalEngine]:
        """Engine servers among the processes, with the port their metrics are on."""
        kinds: dict[int, str] = {}
        argvs: dict[int, list[str]] = {}
        for pid, process in table.items():
            if _CANDIDATE_COMM.search(process.comm):
                argv = cmdline(self.paths.procfs, pid)
                kind = engine_of(argv)
                if kind:
                    kinds[pid], argvs[pid] = kind, argv
        same_netns = same_network_namespace(self.paths.procfs, kinds)
        found: dict[tuple[str, int], LocalEngine] = {}
        for pid in sorted(kinds):
            kind = kinds[pid]
            if not same_netns[pid]:
                self.notes.append(f"{kind} pid {pid} is in another network namespace (a container): add it as a target")
                continue
            try:
                sockets = listening_sockets(self.paths.procfs, pid)
            except PermissionError:
                self.notes.append(f"{kind} pid {pid}: not allowed to read its sockets (run as root)")
                continue
            if not sockets:
                continue  # e.g. TGI's launcher: its router child serves
            engine = ENGINE_FORMATS[kind]
            ports = sorted({s.port for s in sockets})
            hinted = _flag_value(argvs[pid], engine.port_flags)
            port = next((p for p in (hinted, engine.default_port) if p in ports), ports[0])
            address = next(s.address for s in sockets if s.port == port)
            if address in ("0.0.0.0", "::"):
                address = "127.0.0.1"  # "::" is dual-stack on Linux unless bindv6only
            root = pid
            while table.get(root) and kinds.get(table[root].ppid) == kind:
                root = table[root].ppid
            # A forked child sharing the listening socket is the same server: keep the topmost.
            found.setdefault((address, port), LocalEngine(kind, pid, root, address, port))
        return sorted(found.values(), key=lambda e: (e.port, e.host))

    def _scrape_all(self, targets: list[Target]) -> list[Result]:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_SCRAPE_THREADS, thread_name_prefix="inference-scrape")
            pool = self._pool
        futures: dict[Future[dict[str, Reading]], Target] = {pool.submit(self._scrape, t): t for t in targets}
        done, _ = wait_for(futures, timeout=self.timeout + 0.5)
        results = []
        for future, target in futures.items():
            if future not in done:
                future.cancel()
                results.append(Result(target, None, f"no answer within {self.timeout:g}s"))
                continue
            try:
                results.append(Result(target, future.result()))
            except ScrapeError as exc:
                results.append(Result(target, None, str(exc)))
            except Exception as exc:  # whatever one target sends, the others are still reported
                results.append(Result(target, None, describe_error(exc)))
        for result in results:
            self._log_change(result)
        return sorted(results, key=lambda r: (r.target.engine, r.target.endpoint))

    def _scrape(self, target: Target) -> dict[str, Reading]:
        text = self.fetch(target.url, self.timeout)
        samples = Samples(text)
        engine = ENGINE_FORMATS[target.engine]
        if not samples.has_prefix(engine.prefix):
            raise ScrapeError(f"no {engine.prefix}* metrics in the answer: not a {engine.title} metrics endpoint?")
        return engine.normalise(samples)

    def _log_change(self, result: Result) -> None:
        if self._quiet:
            return
        endpoint = result.target.endpoint
        if result.readings is None and self._down.get(endpoint) != result.error:
            self.log.warning(
                "inference target down: %s",
                result.error,
                extra={"engine": result.target.engine, "endpoint": endpoint},
            )
            self._down[endpoint] = result.error
        elif result.readings is not None and endpoint in self._down:
            self.log.info("inference target up", extra={"engine": result.target.engine, "endpoint": endpoint})
            del self._down[endpoint]

    # --- output ---

    def _families(
        self, results: list[Result], engines: dict[str, LocalEngine], table: dict[int, Process]
    ) -> list[Metric]:
        up, kv, waiting, running, preemptions, hits, queries, info = (
            spec.family()
            for spec in (
                UP,
                KV_CACHE_USAGE,
                REQUESTS_WAITING,
                REQUESTS_RUNNING,
                PREEMPTIONS,
                PREFIX_HITS,
                PREFIX_QUERIES,
                PROCESS_INFO,
            )
        )
        ttft, itl = TTFT.histogram_family(), ITL.histogram_family()
        gauges = (
            (kv, "kv_cache_usage"),
            (waiting, "waiting"),
            (running, "running"),
            (preemptions, "preemptions"),
            (hits, "prefix_hits"),
            (queries, "prefix_queries"),
        )
        for result in results:
            target = result.target
            if result.readings is None:
                # The series that were 1 turn 0 (same labels), rather than vanishing.
                for model in self._models.get(target.endpoint, [""]):
                    up.add_metric([target.engine, target.endpoint, model], 0)
                continue
            models = sorted(result.readings) or [""]
            self._models[target.endpoint] = models
            for model in models:
                labels = [target.engine, target.endpoint, model]
                up.add_metric(labels, 1)
                reading = result.readings.get(model, Reading())
                for family, name in gauges:
                    value = getattr(reading, name)
                    if value is not None:
                        family.add_metric(labels, value)
                for family_h, histogram in ((ttft, reading.ttft), (itl, reading.itl)):
                    if histogram is not None:
                        buckets = [(floatToGoString(b), c) for b, c in sorted(histogram.buckets.items())]
                        family_h.add_metric(labels, buckets, histogram.sum)
        gpu_info = GPU_INFO.family()
        published = gpus.published()  # the GPU collector's latest round
        for endpoint, engine in sorted(engines.items()):
            pids = set(descendants(table, engine.root))
            for pid in sorted(pids):
                info.add_metric([engine.engine, endpoint, str(pid), slurm_job(self.paths.procfs, pid)], 1)
            for gpu in published:
                if any(process.pid in pids for process in gpu.processes):
                    gpu_info.add_metric([engine.engine, endpoint, str(gpu.index), gpu.uuid], 1)
        families: list[Metric] = [up, kv, waiting, running, preemptions, hits, queries, ttft, itl, info, gpu_info]
        return [f for f in families if f.samples]
