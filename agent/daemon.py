"""The daemon's life: build workers from a config, serve, reload, stop.

Signal handlers only enqueue (``SimpleQueue.put`` is safe in a signal handler); the main
loop dispatches: SIGHUP or a change of the config file on disk reloads, SIGTERM/SIGINT
stop.  A reload builds and checks the whole new configuration first and swaps it in only
if it is valid; otherwise the old one keeps running and the error is logged.
"""

from __future__ import annotations

import logging
import queue
import resource
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep.agent.collector import Collector, CollectorContext, describe_error
from lockstep.agent.config import Config, ConfigError, Overrides, load_config
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.gpus import GpuInventory
from lockstep.agent.hotplug import HotplugMonitor
from lockstep.agent.logs import collector_logger, setup_logging
from lockstep.agent.scheduler import Scheduler, State, Worker, WorkerView
from lockstep.agent.sdnotify import Notifier
from lockstep.agent.seams import Seams
from lockstep.agent.server import AgentHTTPServer, ServerLimits, make_server
from lockstep.agent.webconfig import WebConfig, WebConfigError, load_web_config
from lockstep.agent.yamlfile import YamlFileError, read_yaml_bytes

log = logging.getLogger("lockstep.agent")


@dataclass(frozen=True)
class Setup:
    """Everything a config is built from, kept so a reload can build the next one the same way."""

    config_path: Path | None
    available: Mapping[str, type[Collector]]
    overrides: Overrides
    seams: Seams

    def load(self) -> Config:
        return load_config(self.config_path, self.available, self.overrides)


def load_web(config: Config) -> WebConfig:
    return load_web_config(config.web_config_file) if config.web_config_file else WebConfig()


# The main loop's tick (see serve()).
MAIN_TICK_SECONDS = 5.0
# The /healthz-only listener answers a probe every few seconds: one worker, few connections.
HEALTH_LIMITS = ServerLimits(max_connections=32, workers=1)


class Agent:
    """The workers and exporter of the current config, plus the HTTP server if serving."""

    def __init__(self, setup: Setup, config: Config, web: WebConfig, single_round: bool = False) -> None:
        self.setup = setup
        # A single round (lockstep once) runs each collector once: no uevent listener (a device
        # event elsewhere on the machine would run a collector again) and no round a collector's
        # own thread asks for (the GPU collector's XID listener, draining an XID 79 during the
        # first round, made the GPU collector run twice before the exposition on a busy machine).
        self.single_round = single_round
        self.config = config
        self.web = web
        self.workers: dict[str, Worker] = {}
        # Every collector's rounds, on two threads at rest (agent/scheduler.py).
        self.scheduler = Scheduler()
        self.exporter = SnapshotExporter(self.views)
        self.server: AgentHTTPServer | None = None
        self._server_thread: threading.Thread | None = None
        self.health_server: AgentHTTPServer | None = None  # the plain /healthz-only listener
        self._health_thread: threading.Thread | None = None
        self._stuck_logged: set[str] = set()
        self.hotplug: HotplugMonitor | None = None
        # The GPUs the GPU collector publishes and the Slurm, Kubernetes and inference collectors
        # read: one for the agent's life, across reloads (agent/gpus.py).
        self.gpu_inventory = GpuInventory()
        self._apply_collectors(config)

    def views(self) -> list[WorkerView]:
        return [w.view() for w in list(self.workers.values())]

    def _new_worker(self, name: str, config: Config, predecessor: Worker | None, started: dict[str, Worker]) -> Worker:
        settings = config.collectors[name]
        logger = collector_logger(name)
        context = CollectorContext(
            paths=config.paths,
            options=settings.options,
            log=logger,
            seams=self.setup.seams,
            gpu_inventory=self.gpu_inventory,
        )
        collector = self.setup.available[name](context)
        after = [started[needed] for needed in collector.needs if needed in started]
        worker = Worker(
            collector,
            interval=settings.interval,
            deadline=settings.deadline,
            staleness_intervals=config.staleness_intervals,
            log=logger,
            predecessor=predecessor,
            after=after,
            scheduler=self.scheduler,
        )
        if not self.single_round:
            context.run_now.target = worker.wake
        return worker

    def _apply_collectors(self, config: Config) -> None:
        """Start, keep or replace workers so they match ``config``."""
        old_config = self.config
        workers: dict[str, Worker] = {}
        # Collectors others need first (e.g. gpu), so their workers exist when the others are made.
        needed = {n for name in config.enabled_collectors for n in self.setup.available[name].needs}
        for name in sorted(config.enabled_collectors, key=lambda n: n not in needed):
            current = self.workers.get(name)
            unchanged = (
                current is not None
                and old_config.collectors[name] == config.collectors[name]
                and old_config.paths == config.paths
                and old_config.staleness_intervals == config.staleness_intervals
            )
            if unchanged:
                workers[name] = current  # type: ignore[assignment]
                continue
            # Built before any running worker is stopped: a collector that fails to build
            # leaves the running set untouched (the caller keeps the old configuration).
            workers[name] = self._new_worker(name, config, predecessor=current, started=workers)
        started = [w for n, w in workers.items() if self.workers.get(n) is not w]
        for name, worker in self.workers.items():
            if workers.get(name) is not worker:
                worker.stop()
        self.workers = workers
        self.config = config
        for worker in started:
            worker.start()
        self._update_hotplug()

    def _update_hotplug(self) -> None:
        """Listen to the uevent subsystems the running collectors ask for, and no others."""
        wanted = {s for w in self.workers.values() for s in w.collector.hotplug_subsystems}
        if self.single_round:
            wanted = set()
        if self.hotplug is not None and self.hotplug.subsystems == wanted:
            return
        if self.hotplug is not None:
            self.hotplug.stop()
            self.hotplug = None
        if wanted:
            self.hotplug = HotplugMonitor(wanted, self._on_hotplug)
            self.hotplug.start()

    def restart_what_failed_to_start(self) -> None:
        """Threads that could not be created (the process at its task limit) are started again."""
        for worker in list(self.workers.values()):
            if not worker.started and not worker.stopped:
                worker.start()
        if self.hotplug is not None and self.hotplug.thread_failed:
            self.hotplug.start()

    def _on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        for worker in list(self.workers.values()):
            if subsystem in worker.collector.hotplug_subsystems:
                worker.log.info("hotplug event", extra={"action": action, "subsystem": subsystem, "device": sys_path})
                try:
                    worker.collector.on_hotplug(action, subsystem, sys_path)
                except Exception:
                    worker.log.exception("hotplug handler failed")
                worker.wake()

    def start_server(self) -> None:
        self.server = make_server(self.config.listen, self.exporter, self.web, lambda: self.config.enabled_collectors)
        self._server_thread = _serve(self.server)
        log.info("listening", extra={"listen": self.config.listen, "tls": self.web.ssl_context is not None})
        if self.config.health_listen is not None:
            try:
                self.health_server = self._make_health_server(self.config.health_listen)
            except OSError as exc:
                raise OSError(exc.errno, f"{exc.strerror} (health_listen {self.config.health_listen})") from exc
            self._health_thread = _serve(self.health_server)
            log.info("serving /healthz alone", extra={"listen": self.config.health_listen})

    def _make_health_server(self, listen: str) -> AgentHTTPServer:
        """The plain /healthz-only listener: no TLS, no auth, whatever the web config says."""
        web = WebConfig()
        return make_server(listen, self.exporter, web, list, HEALTH_LIMITS, health_only=True, healthy=self.serving)

    def reload(self) -> bool:
        """Load the config again; apply it if valid, else keep the running one.  True if applied."""
        try:
            config = self.setup.load()
            web = load_web(config)
        except (ConfigError, WebConfigError) as exc:
            log.error("new configuration rejected, keeping the running one: %s", "; ".join(exc.problems))
            return False
        except Exception as exc:  # a reload never takes the daemon down
            log.error("new configuration rejected, keeping the running one: %s", describe_error(exc))
            return False
        if self.server is not None and config.listen != self.config.listen:
            try:
                server = make_server(config.listen, self.exporter, web, lambda: self.config.enabled_collectors)
                thread = _serve(server)
            except (OSError, RuntimeError) as exc:
                log.error("cannot listen on %s (%s), keeping the running configuration", config.listen, exc)
                return False
            old = self.server
            self.server, self._server_thread = server, thread
            old.shutdown()  # returns within a loop tick; answers in progress finish in their workers
        elif self.server is not None:
            self.server.web_config = web
        if self.server is not None and config.health_listen != self.config.health_listen:
            if self.health_server is not None:
                self.health_server.shutdown()
                self.health_server, self._health_thread = None, None
            if config.health_listen is not None:
                try:
                    health_server = self._make_health_server(config.health_listen)
                    self._health_thread, self.health_server = _serve(health_server), health_server
                except (OSError, RuntimeError) as exc:
                    log.error("cannot serve /healthz on %s: %s", config.health_listen, exc)
        self.web = web
        try:
            self._apply_collectors(config)
        except Exception as exc:
            log.error("new configuration rejected, keeping the running one: %s", describe_error(exc))
            return False
        logging.getLogger("lockstep").setLevel(config.log_level.upper())
        log.info("configuration reloaded", extra={"collectors": ",".join(config.enabled_collectors)})
        return True

    def log_stuck(self) -> None:
        """Log once per stuck run (the view reports it to scrapes by itself)."""
        for view in self.views():
            if view.state == State.STUCK and view.name not in self._stuck_logged:
                self._stuck_logged.add(view.name)
                collector_logger(view.name).error("collector stuck: %s", view.reason)
            elif view.state != State.STUCK:
                self._stuck_logged.discard(view.name)

    def serving(self) -> bool:
        """Whether the main listener's event loop runs (what the health listener reports)."""
        return self._server_thread is not None and self._server_thread.is_alive()

    def healthy(self) -> bool:
        return all(thread is None or thread.is_alive() for thread in (self._server_thread, self._health_thread))

    def stop(self) -> None:
        if self.hotplug is not None:
            self.hotplug.stop()
        for worker in self.workers.values():
            worker.stop()
        for server in (self.server, self.health_server):
            if server is not None:
                server.shutdown()


def _serve(server: AgentHTTPServer) -> threading.Thread:
    """Run a listener's event loop in its own thread."""
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return thread


class ConfigWatcher:
    """Calls ``on_change`` when the config file's content changes on disk.

    Watches the file's directory, not the file: editors replace files by rename, and
    Kubernetes updates a mounted ConfigMap by swapping the ``..data`` symlink, so the file
    itself is never modified.  Any event in the directory triggers a content comparison.
    """

    def __init__(self, path: Path, on_change: Callable[[], None]) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        self.path = path
        self._last = self._read()
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type in ("opened", "closed_no_write"):
                    return
                current = watcher._read()
                if current != watcher._last:
                    watcher._last = current
                    on_change()

        self._observer = Observer()
        self._observer.daemon = True
        self._observer.schedule(Handler(), str(path.parent.resolve()), recursive=False)

    def _read(self) -> bytes | str:
        """The file's bytes, or why they cannot be read: bounded and never blocking (this runs
        in watchdog's thread, and a FIFO or /dev/zero put in the file's place must not hang it)."""
        try:
            return read_yaml_bytes(self.path)
        except YamlFileError as exc:
            return str(exc)

    def start(self) -> None:
        self._observer.start()

    def stop(self) -> None:
        self._observer.stop()


def _wait_for_quiet(events: queue.SimpleQueue[str], quiet: float = 0.3) -> bool:
    """Swallow reload events until none came for ``quiet`` seconds; False if a stop came instead."""
    while True:
        try:
            event = events.get(timeout=quiet)
        except queue.Empty:
            return True
        if event == "stop":
            return False


def _shutdown(agent: Agent, watcher: ConfigWatcher | None, handlers: dict[Any, Any]) -> None:
    if watcher is not None:
        watcher.stop()
    agent.stop()
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one, as Go programs do at start: a soft limit
    of 1,024 is there for select(), which the agent does not use (selectors and epoll), and the
    descriptors the collectors and the HTTP endpoint may hold are derived from it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. a hard limit above fs.nr_open
            log.debug("cannot raise the open-file limit from %s to %s: %s", soft, hard, exc)


def serve(setup: Setup, config: Config, ready: Callable[[Agent], None] | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT.  Returns the exit status."""
    setup_logging(config.log_level, config.log_format)
    raise_open_file_limit()
    try:
        web = load_web(config)
    except WebConfigError as exc:
        for problem in exc.problems:
            log.error("web config: %s", problem)
        return 2
    for setting in web.ignored:
        log.warning("web config setting %s is accepted but not applied", setting)
    events: queue.SimpleQueue[str] = queue.SimpleQueue()
    agent = Agent(setup, config, web)
    # Signals and the file watcher first: once /healthz answers, a reload is never missed.
    previous = {
        signal.SIGHUP: signal.signal(signal.SIGHUP, lambda *_: events.put("reload")),
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: events.put("stop")),
        signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: events.put("stop")),
    }
    watcher = None
    if setup.config_path is not None:
        watcher = ConfigWatcher(setup.config_path, lambda: events.put("file-changed"))
        watcher.start()
    notifier = Notifier()
    try:
        agent.start_server()
    except (OSError, RuntimeError) as exc:  # RuntimeError: no thread for the event loop
        log.error("cannot listen on %s: %s", config.listen, exc)
        _shutdown(agent, watcher, previous)
        return 1
    notifier.notify("READY=1")
    if ready is not None:
        ready(agent)
    log.info("agent started", extra={"collectors": ",".join(config.enabled_collectors)})
    # The main thread's own wake-ups: a stuck collector logged, a thread that could not start
    # started again, systemd's watchdog fed (at least twice per WatchdogSec) within this long.
    tick = min(MAIN_TICK_SECONDS, notifier.watchdog_interval or MAIN_TICK_SECONDS)
    try:
        while True:
            try:
                event = events.get(timeout=tick)
            except queue.Empty:
                event = "tick"
            if event == "stop":
                break
            if event in ("reload", "file-changed"):
                # An editor's save or a kubelet update is a burst of events, possibly through a
                # half-written file: wait until the directory is quiet, then reload once.
                if event == "file-changed" and not _wait_for_quiet(events):
                    break
                log.info("reloading configuration", extra={"reason": "SIGHUP" if event == "reload" else "file changed"})
                notifier.notify("RELOADING=1")
                agent.reload()
                notifier.notify("READY=1")
            agent.log_stuck()
            agent.restart_what_failed_to_start()
            if notifier.watchdog_interval and agent.healthy():
                notifier.notify("WATCHDOG=1")
    finally:
        agent.log_stuck()  # stuck since the last tick: said before stopping
        log.info("stopping")
        notifier.notify("STOPPING=1")
        _shutdown(agent, watcher, previous)
    return 0
