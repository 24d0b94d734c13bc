"""The inference collector: each round finds the targets (configured and discovered), scrapes
them concurrently, and reports the normalised readings plus the engines' processes and GPUs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere, describe_error
from lockstep.agent.config import parse_bool, parse_duration
from lockstep.agent.options import option
from lockstep.agent.procs import Process, descendants, process_table, slurm_job
from lockstep.collectors.inference.discovery import LocalEngine, local_engines, local_host
from lockstep.collectors.inference.engines import ENGINE_FORMATS
from lockstep.collectors.inference.fetch import INFERENCE_HTTP, fetch_http
from lockstep.collectors.inference.metrics import (
    DECODE_TOKENS,
    E2E_LATENCY,
    GENERATION_TOKENS,
    GPU_INFO,
    HTTP_SERVER_ERRORS,
    ITL,
    KV_CACHE_CAPACITY,
    KV_CACHE_USAGE,
    PREEMPTIONS,
    PREFIX_EXTERNAL_HITS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROCESS_INFO,
    PROMPT_TOKENS,
    QUEUE_TIME,
    REQUESTS_FINISHED,
    REQUESTS_REJECTED,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SPEC_ACCEPTED_TOKENS,
    SPEC_DRAFT_TOKENS,
    TTFT,
    UP,
)
from lockstep.collectors.inference.readings import Reading, Samples, ScrapeError
from lockstep.collectors.inference.targets import Target, parse_targets

DEFAULT_TIMEOUT = 3.0
MAX_SCRAPE_THREADS = 16
# How long a discovered engine whose process is gone is still reported (up 0).
GONE_ENGINE_SECONDS = 600.0


@dataclass
class Result:
    target: Target
    readings: dict[str, Reading] | None  # None: down
    error: str = ""


@dataclass(frozen=True)
class InferenceOptions:
    targets: tuple[Target, ...] = option(
        (),
        parse_targets,
        "an engine's metrics endpoint as ENGINE=URL, ENGINE one of " + ", ".join(ENGINE_FORMATS),
        flag="--inference.target",
        repeatable=True,
    )
    discover: bool = option(True, parse_bool, "also scrape the engines found among this node's processes")
    timeout: float = option(DEFAULT_TIMEOUT, parse_duration, "how long one target may take to answer")


class InferenceCollector(Collector[InferenceOptions]):
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
        PROMPT_TOKENS,
        GENERATION_TOKENS,
        REQUESTS_FINISHED,
        E2E_LATENCY,
        QUEUE_TIME,
        KV_CACHE_CAPACITY,
        PREFIX_EXTERNAL_HITS,
        DECODE_TOKENS,
        SPEC_DRAFT_TOKENS,
        SPEC_ACCEPTED_TOKENS,
        REQUESTS_REJECTED,
        HTTP_SERVER_ERRORS,
        PROCESS_INFO,
        GPU_INFO,
    )
    needs = ("gpu",)  # the GPU inventory (context.gpu_inventory) says which GPUs run the engines' processes
    options_class = InferenceOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.fetch: Callable[[str, float], str] = context.seams.get(INFERENCE_HTTP) or fetch_http
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._models: dict[str, list[str]] = {}  # endpoint -> models of its last good answer
        self._down: dict[str, str] = {}  # endpoint -> why, for logging changes once
        self._rejected: dict[str, str] = {}  # endpoint -> an out-of-domain value it sent, logged once
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
        table = process_table(self.paths.procfs) if self.options.discover else {}
        local = local_engines(self.paths.procfs, table, self.notes) if table else []
        targets = list(self.options.targets)
        engines: dict[str, LocalEngine] = {}  # endpoint -> the local process serving it
        for target in self.options.targets:
            parts = urlsplit(target.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            for engine in local:
                if local_host(parts.hostname or "") and engine.port == port:
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
            if now - seen >= GONE_ENGINE_SECONDS or target in self.options.targets:
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

    def _scrape_all(self, targets: list[Target]) -> list[Result]:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_SCRAPE_THREADS, thread_name_prefix="inference-scrape")
            pool = self._pool
        futures: dict[Future[dict[str, Reading]], Target] = {pool.submit(self._scrape, t): t for t in targets}
        done, _ = wait_for(futures, timeout=self.options.timeout + 0.5)
        results = []
        for future, target in futures.items():
            if future not in done:
                future.cancel()
                results.append(Result(target, None, f"no answer within {self.options.timeout:g}s"))
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
        text = self.fetch(target.url, self.options.timeout)
        engine = ENGINE_FORMATS[target.engine]
        samples = Samples(text, engine.parsed)
        if not samples.has_prefix(engine.prefix):
            raise ScrapeError(f"no {engine.prefix}* metrics in the answer: not a {engine.title} metrics endpoint?")
        rejected = samples.rejected_example if samples.rejected else ""
        if rejected != self._rejected.get(target.endpoint, ""):  # once per change, per target
            if rejected:
                self.log.warning(
                    "left out %d values that are not finite numbers of at least 0, e.g. %s",
                    samples.rejected,
                    rejected,
                    extra={"engine": target.engine, "endpoint": target.endpoint},
                )
            self._rejected[target.endpoint] = rejected
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
        families = Families(self.metrics)
        up = families[UP]
        gauges = (
            (families[KV_CACHE_USAGE], "kv_cache_usage"),
            (families[REQUESTS_WAITING], "waiting"),
            (families[REQUESTS_RUNNING], "running"),
            (families[PREEMPTIONS], "preemptions"),
            (families[PREFIX_HITS], "prefix_hits"),
            (families[PREFIX_QUERIES], "prefix_queries"),
            (families[PROMPT_TOKENS], "prompt_tokens"),
            (families[GENERATION_TOKENS], "generation_tokens"),
            (families[KV_CACHE_CAPACITY], "kv_capacity_tokens"),
            (families[PREFIX_EXTERNAL_HITS], "prefix_external_hits"),
            (families[DECODE_TOKENS], "decode_tokens"),
            (families[SPEC_DRAFT_TOKENS], "spec_draft_tokens"),
            (families[SPEC_ACCEPTED_TOKENS], "spec_accepted_tokens"),
            (families[REQUESTS_REJECTED], "rejected"),
            (families[HTTP_SERVER_ERRORS], "http_server_errors"),
        )
        histogram_fields = ((TTFT, "ttft"), (ITL, "itl"), (E2E_LATENCY, "e2e_latency"), (QUEUE_TIME, "queue_time"))
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
                for reason, count in sorted((reading.finished or {}).items()):
                    families[REQUESTS_FINISHED].add_metric([*labels, reason], count)
                for spec, name in histogram_fields:
                    histogram = getattr(reading, name)
                    family_h = families[spec]
                    if histogram is not None:
                        buckets = [(floatToGoString(b), c) for b, c in sorted(histogram.buckets.items())]
                        family_h.add_metric(labels, buckets, histogram.sum)
        info, gpu_info = families[PROCESS_INFO], families[GPU_INFO]
        published = self.context.gpu_inventory.published()  # the GPU collector's latest round
        for endpoint, engine in sorted(engines.items()):
            pids = set(descendants(table, engine.root))
            for pid in sorted(pids):
                info.add_metric([engine.engine, endpoint, str(pid), slurm_job(self.paths.procfs, pid)], 1)
            for gpu in published:
                if any(process.pid in pids for process in gpu.processes):
                    gpu_info.add_metric([engine.engine, endpoint, str(gpu.index), gpu.uuid], 1)
        return families.with_samples()
