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

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere, describe_error
from lockstep.agent.exposition import go_float as floatToGoString
from lockstep.agent.families import Metric
from lockstep.agent.options import option, parse_bool, parse_duration
from lockstep.agent.seams import MONOTONIC_CLOCK
from lockstep.collectors.inference.discovery import (
    PROBE_TIMEOUT,
    LocalEngine,
    Rotation,
    engine_processes,
    local_engines,
    local_host,
)
from lockstep.collectors.inference.engines import ENGINE_FORMATS
from lockstep.collectors.inference.fetch import INFERENCE_HTTP, fetch_http
from lockstep.collectors.inference.metrics import (
    DECODE_TOKENS,
    DISCOVERED_PROCESSES,
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
    SKIPPED_VALUES,
    SPEC_ACCEPTED_TOKENS,
    SPEC_DRAFT_TOKENS,
    TTFT,
    UP,
)
from lockstep.collectors.inference.readings import Reading, Samples, ScrapeError
from lockstep.collectors.inference.targets import Target, parse_targets
from lockstep.collectors.toolkit.procs import Process, process_table, slurm_job

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
        SKIPPED_VALUES,
        DISCOVERED_PROCESSES,
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
        self._skipped: dict[Target, int] = {}  # values left out of the target's answers so far
        self._skipped_lock = threading.Lock()  # scrapes run in the pool's threads
        # Discovered endpoints -> (target, when a process last served it), monotonic clock.
        self._discovered: dict[str, tuple[Target, float]] = {}
        self._rotation = Rotation()  # which discovered candidates each round scrapes
        self._discovery_counts: dict[str, int] = {}  # lockstep_inference_discovered_processes
        self._silent_logged = 0  # silent candidates in the last summary line
        self._candidates: list[LocalEngine] = []  # the last round's discovered candidates
        # When a discovered engine was last served and probed (the simulated node and tests
        # replace the clock through the seam, agent/seams.py).
        self._clock = context.seams.get(MONOTONIC_CLOCK) or time.monotonic
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
        counts: dict[str, int] = {}
        local = local_engines(self.paths.procfs, table, self.notes, counts) if table else []
        targets = list(self.options.targets)
        engines: dict[str, LocalEngine] = {}  # endpoint -> the local process serving it
        for target in self.options.targets:
            parts = urlsplit(target.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            for engine in local:
                if local_host(parts.hostname or "") and engine.port == port:
                    engines[target.endpoint] = engine
        served = {(e.pid, e.port) for e in engines.values()}
        # Configured explicitly: not again under another name.
        candidates = [e for e in local if (e.pid, e.port) not in served]
        now = self._clock()
        plan = self._rotation.plan(candidates, now)
        timeouts: dict[Target, float] = {}
        discovered: dict[Target, LocalEngine] = {}
        for engine in plan.scrape + plan.probe:  # the engines that answer first: never queued behind a probe
            target = Target(engine.engine, url=engine.url, endpoint=engine.url)
            targets.append(target)
            discovered[target] = engine
            if not self._rotation.known(engine):
                timeouts[target] = min(self.options.timeout, PROBE_TIMEOUT)
        results = []
        silent = []  # candidates that did not answer as an engine and never have
        for result in self._scrape_all(targets, timeouts):
            engine_or_none = discovered.get(result.target)
            if engine_or_none is None:
                results.append(result)
                continue
            self._rotation.record(engine_or_none, result.readings is not None, now)
            if self._rotation.known(engine_or_none):
                results.append(result)
                engines[result.target.endpoint] = engine_or_none
            else:
                silent.append(result)
        for engine in plan.resting:  # an engine that stopped answering, probed again later
            target = Target(engine.engine, url=engine.url, endpoint=engine.url)
            results.append(Result(target, None, self._down.get(target.endpoint, "not answering")))
            engines[target.endpoint] = engine
        self._log_silent(silent)
        self._candidates = candidates
        self._discovery_counts = {**self._rotation.census(candidates), "unreadable": 0, "other_namespace": 0, **counts}
        # A discovered engine whose process is gone (crashed, stopped) stays, down, for a
        # while: `up == 0` should see it rather than the series just vanishing.
        for result in results:
            if result.target.endpoint in engines:
                self._discovered[result.target.endpoint] = (result.target, now)
        gone = []
        for endpoint, (target, seen) in list(self._discovered.items()):
            if endpoint in engines:
                continue
            if now - seen >= GONE_ENGINE_SECONDS or target in self.options.targets:
                del self._discovered[endpoint]
                continue
            title = ENGINE_FORMATS[target.engine].title
            gone.append(Result(target, None, f"the {title} process that served it is gone"))
        if not targets and not gone and not candidates:
            raise NothingHere(
                "no inference targets configured (--inference.target ENGINE=URL) and no "
                + ", ".join(e.title for e in ENGINE_FORMATS.values())
                + " server found among this node's processes"
                + (f" ({'; '.join(self.notes)})" if self.notes else "")
            )
        for result in gone:
            self._log_change(result)
        results = sorted(results + gone, key=lambda r: (r.target.engine, r.target.endpoint))
        return results, engines, table

    def _log_silent(self, silent: list[Result]) -> None:
        """One line when the number of silent candidates changes, not one per probe (a user's
        hundreds of look-alikes wrote a warning each, every time its error changed)."""
        count = self._rotation.silent()
        if count:
            self.notes.append(f"{count} processes look like engines but have not answered as one (probed in turn)")
        if count != self._silent_logged and not self._quiet:
            if count and silent:
                example = f"{silent[0].target.endpoint}: {silent[0].error}"
                self.log.warning(
                    "%d processes that look like inference engines do not answer as one (e.g. %s); "
                    "they are probed again less and less often",
                    count,
                    example,
                )
            elif count == 0 and self._silent_logged:
                self.log.info("no silent look-alike engine processes any more")
            self._silent_logged = count
        for result in silent:
            self._down.pop(result.target.endpoint, None)

    def _scrape_all(self, targets: list[Target], timeouts: dict[Target, float]) -> list[Result]:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_SCRAPE_THREADS, thread_name_prefix="inference-scrape")
            pool = self._pool
        futures: dict[Future[dict[str, Reading]], Target] = {
            pool.submit(self._scrape, t, timeouts.get(t, self.options.timeout)): t for t in targets
        }
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
            if result.target not in timeouts:  # a probe of a candidate is logged in summary (_log_silent)
                self._log_change(result)
        return sorted(results, key=lambda r: (r.target.engine, r.target.endpoint))

    def _scrape(self, target: Target, timeout: float) -> dict[str, Reading]:
        text = self.fetch(target.url, timeout)
        engine = ENGINE_FORMATS[target.engine]
        samples = Samples(text, engine.parsed)
        if not samples.has_prefix(engine.prefix):
            raise ScrapeError(f"no {engine.prefix}* metrics in the answer: not a {engine.title} metrics endpoint?")
        readings = engine.normalise(samples)  # may leave out invalid histograms too (readings.histograms)
        with self._skipped_lock:
            self._skipped[target] = self._skipped.get(target, 0) + samples.rejected
        rejected = samples.rejected_example if samples.rejected else ""
        if rejected != self._rejected.get(target.endpoint, ""):  # once per change, per target
            if rejected:
                self.log.warning(
                    "left out %d values outside their domain, e.g. %s",
                    samples.rejected,
                    rejected,
                    extra={"engine": target.engine, "endpoint": target.endpoint},
                )
            self._rejected[target.endpoint] = rejected
        return readings

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
        with self._skipped_lock:
            # Reported with the target's other values; kept while it is down, forgotten with it.
            current = {r.target for r in results}
            self._skipped = {t: n for t, n in self._skipped.items() if t in current}
            for result in results:
                if result.readings is not None:
                    count = self._skipped.get(result.target, 0)
                    families[SKIPPED_VALUES].add_metric([result.target.engine, result.target.endpoint], count)
        info, gpu_info = families[PROCESS_INFO], families[GPU_INFO]
        published = self.context.gpu_inventory.published()  # the GPU collector's latest round
        others = [e for e in self._candidates if e.url not in engines]
        processes = engine_processes(table, engines, others)  # each process under one engine
        for endpoint, engine in sorted(engines.items()):
            pids = set(processes[endpoint])
            for pid in sorted(pids):
                info.add_metric([engine.engine, endpoint, str(pid), slurm_job(self.paths.procfs, pid)], 1)
            for gpu in published:
                if any(process.pid in pids for process in gpu.processes):
                    gpu_info.add_metric([engine.engine, endpoint, str(gpu.index), gpu.uuid], 1)
        if self.options.discover:
            for category, count in self._discovery_counts.items():
                families[DISCOVERED_PROCESSES].add_metric([category], count)
        return families.with_samples()
