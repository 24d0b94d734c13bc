"""Checkpoint collector: when saves start and finish under configured roots, and how long they take.

A *root* is a directory holding a job's checkpoints (configured as glob patterns such as
``/lustre/ckpt/*``, host paths resolved under --path.rootfs).  Each entry directly in a
root is one *save*, recognised by how the common writers mark a save's start and end:

- PyTorch DCP: a directory of ``*.distcp`` shards; ``.metadata`` is written last.
- NeMo: a ``NAME-unfinished`` marker exists while ``NAME`` (``NAME.ckpt``, ``NAME.nemo``) is written.
- Megatron: ``iter_NNNNNNN/``; complete once ``latest_checkpointed_iteration.txt`` reaches N.
- generic: anything else; complete when nothing in it changed for ``quiet_period``, or at once
  when it appears by renaming a temporary name (``tmp-NAME``, ``NAME.tmp``, ``NAME.partial``).

Times come from the files themselves, so polling and inotify agree and an agent restart
loses nothing: a save starts at the earliest of when the agent first saw a trace of it and
its oldest file's mtime; it ends at its completion marker's mtime (DCP ``.metadata``,
Megatron's tracker file), or its newest file's mtime (NeMo, generic; for a renamed item the
rename time, its ctime).  An incomplete save that started before the newest completed save
is an abandoned leftover (a crashed job's), not in progress.

Watching: ``inotify`` (watchdog) sees writes made on this node only; a root on a network
filesystem written by other nodes needs ``poll``; ``auto`` (default) polls roots on network
and FUSE filesystems and watches the others.  Polling rescans a root every run; inotify
rescans only after events (and every few minutes, in case events were lost).  Either way a
scan stats at most ``max_files`` files per root and reports when it stopped there.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric

from lockstep.agent.collector import Collector, CollectorContext, MetricSpec, NothingHere, Option, describe_error
from lockstep.agent.config import parse_choice, parse_duration, parse_positive_int, parse_string
from lockstep.agent.files import read_text

INFO = MetricSpec(
    "lockstep_checkpoint_info",
    "gauge",
    "One series per checkpoint root, valued 1: the configured pattern it matched, the Slurm job it belongs to "
    "(from job=<id> or similar in its path; empty if unknown), the format of its newest save, and how it is watched.",
    ("root", "pattern", "job_id", "format", "watch"),
)
SAVES = MetricSpec(
    "lockstep_checkpoint_saves_total",
    "counter",
    "Saves completed under the root since the agent started (saves already complete at start are not counted).",
    ("root",),
)
IN_PROGRESS = MetricSpec(
    "lockstep_checkpoint_in_progress_seconds",
    "gauge",
    "How long the current save has been in progress; 0 when none is.",
    ("root",),
    "seconds",
)
LAST_SUCCESS = MetricSpec(
    "lockstep_checkpoint_last_success_timestamp_seconds",
    "gauge",
    "Unix time the newest completed save finished (absent until one is known).",
    ("root",),
    "seconds",
)
LAST_DURATION = MetricSpec(
    "lockstep_checkpoint_last_duration_seconds",
    "gauge",
    "How long the newest completed save took, from its first file to its completion.",
    ("root",),
    "seconds",
)
LAST_SIZE = MetricSpec(
    "lockstep_checkpoint_last_size_bytes", "gauge", "Size of the newest completed save.", ("root",), "bytes"
)
LAST_THROUGHPUT = MetricSpec(
    "lockstep_checkpoint_last_write_throughput_bytes_per_second",
    "gauge",
    "Size of the newest completed save divided by its duration.",
    ("root",),
    "bytes_per_second",
)
EXPECTED_INTERVAL = MetricSpec(
    "lockstep_checkpoint_expected_interval_seconds",
    "gauge",
    "The configured save interval of the root (absent when not configured): alerts compare the age of the last "
    "success and the in-progress time with it.",
    ("root",),
    "seconds",
)
READABLE = MetricSpec(
    "lockstep_checkpoint_root_readable",
    "gauge",
    "1 when the last scan could list the root; 0 when it is missing or not readable (permission denied).",
    ("root",),
)
TRUNCATED = MetricSpec(
    "lockstep_checkpoint_scan_truncated",
    "gauge",
    "1 when the last scan of the root stopped at max_files: sizes and times may be partial.",
    ("root",),
)
ROOTS = MetricSpec(
    "lockstep_checkpoint_roots",
    "gauge",
    "Directories the configured root pattern matches now (0: nothing to watch, e.g. the filesystem is not mounted).",
    ("pattern",),
)

WATCH_MODES = ("auto", "inotify", "poll")
DEFAULT_QUIET_PERIOD = 60.0
DEFAULT_MAX_FILES = 100_000
# A root watched with inotify is rescanned this often even without events (lost events, overflow).
RESYNC_SECONDS = 300.0
DEFAULT_JOB_ID_PATTERN = r"(?<![A-Za-z0-9])(?:slurm[-_]?)?job(?:_?id)?[=_-]?(\d+)(?!\d)"
# Filesystems where other nodes write: inotify sees none of it, so `auto` polls there.
NETWORK_FSTYPES = (
    "nfs",
    "nfs4",
    "lustre",
    "cifs",
    "smb3",
    "gpfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "9p",
    "afs",
    "orangefs",
    "wekafs",
    "virtiofs",
)

DCP_METADATA = ".metadata"
DCP_SHARD_SUFFIX = ".distcp"
NEMO_MARKER_SUFFIX = "-unfinished"
NEMO_MEMBER_SUFFIXES = ("", ".ckpt", ".nemo")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON_ITERATION = re.compile(r"^iter_(\d+)$")
# Pointer files next to saves, not saves (DeepSpeed's "latest", Megatron's tracker).
NOT_SAVES = frozenset({"latest", MEGATRON_TRACKER})
TEMP_PREFIXES = ("tmp-", "tmp_", "tmp.")
TEMP_SUFFIXES = (".tmp", ".temp", ".partial", ".incomplete", ".inprogress")


def final_name(name: str) -> tuple[str, bool]:
    """(the name the save will have, whether ``name`` is a temporary one).

    ``tmp-checkpoint-500`` (Hugging Face Trainer) -> ``checkpoint-500``; ``.model.pt.tmp`` -> ``model.pt``.
    """
    base = name[1:] if name.startswith(".") else name
    for prefix in TEMP_PREFIXES:
        if base.startswith(prefix) and len(base) > len(prefix):
            return base[len(prefix) :], True
    for suffix in TEMP_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[: -len(suffix)], True
    return name, False


# --- configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class RootSpec:
    pattern: str  # a host path glob, e.g. /lustre/ckpt/*
    expected_interval: float | None = None
    watch: str = "auto"
    quiet_period: float = DEFAULT_QUIET_PERIOD


_ROOT_KEYS = ("path", "expected_interval", "watch", "quiet_period")


def parse_roots(value: Any) -> tuple[RootSpec, ...]:
    """A list of roots: each a path pattern, or a mapping with ``path`` and optional
    ``expected_interval``, ``watch`` (auto|inotify|poll) and ``quiet_period``."""
    if value is None or value == ():
        return ()
    items = value if isinstance(value, (list, tuple)) else [value]
    roots = []
    for i, item in enumerate(items):
        where = f"root {i + 1}"
        if isinstance(item, str):
            item = {"path": item}
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a path or a mapping with 'path', got {item!r}")
        unknown = [k for k in item if k not in _ROOT_KEYS]
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_ROOT_KEYS)})")
        if "path" not in item:
            raise ValueError(f"{where}: 'path' is required")
        try:
            path = parse_string(item["path"])
            if not path.startswith("/"):
                raise ValueError(f"expected an absolute path, got {path!r}")
            interval = item.get("expected_interval")
            roots.append(
                RootSpec(
                    pattern=path,
                    expected_interval=parse_duration(interval) if interval is not None else None,
                    watch=parse_choice(WATCH_MODES)(item.get("watch", "auto")),
                    quiet_period=parse_duration(item.get("quiet_period", DEFAULT_QUIET_PERIOD)),
                )
            )
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tuple(roots)


def parse_regex_with_group(value: Any) -> str:
    text = parse_string(value)
    try:
        compiled = re.compile(text)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    if compiled.groups < 1:
        raise ValueError("the pattern needs one (group) capturing the job id")
    return text


# --- scanning ------------------------------------------------------------------------------


class Budget:
    """How many more directory entries a scan may stat."""

    def __init__(self, entries: int) -> None:
        self.left = entries
        self.exhausted = False

    def take(self) -> bool:
        if self.left <= 0:
            self.exhausted = True
            return False
        self.left -= 1
        return True


@dataclass
class Walk:
    """What the files of one save look like."""

    files: int = 0
    size: int = 0
    oldest_mtime: float | None = None
    newest_mtime: float | None = None
    own_mtime: float = 0.0  # the item itself (an empty directory: when it was made)
    own_ctime: float = 0.0  # the item itself (a renamed item: when it was renamed)
    metadata_mtime: float | None = None  # DCP: .metadata directly inside
    has_shards: bool = False  # DCP: *.distcp directly inside
    truncated: bool = False


def walk(path: str, budget: Budget) -> Walk:
    """Size and mtimes of a file, or of every file under a directory, within the budget."""
    own = os.stat(path, follow_symlinks=False)
    result = Walk(own_mtime=own.st_mtime, own_ctime=own.st_ctime)
    if not stat.S_ISDIR(own.st_mode):
        result.files, result.size = 1, own.st_size
        result.oldest_mtime = result.newest_mtime = own.st_mtime
        return result
    try:
        # Looked up directly, not found by the walk: a capped walk may stop before reaching it.
        result.metadata_mtime = os.stat(os.path.join(path, DCP_METADATA)).st_mtime
    except OSError:
        pass
    stack = [(path, True)]
    while stack:
        directory, top = stack.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if not budget.take():
                        result.truncated = True
                        return result
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed meanwhile (a writer replacing a temp file)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append((entry.path, False))
                        continue
                    result.files += 1
                    result.size += st.st_size
                    mtime = st.st_mtime
                    result.oldest_mtime = mtime if result.oldest_mtime is None else min(result.oldest_mtime, mtime)
                    result.newest_mtime = mtime if result.newest_mtime is None else max(result.newest_mtime, mtime)
                    if top and entry.name.endswith(DCP_SHARD_SUFFIX):
                        result.has_shards = True
        except OSError:
            if top:
                raise
            continue  # a subdirectory removed or unreadable: the rest still counts
    return result


@dataclass
class Observation:
    """One save as the latest scan saw it."""

    name: str
    kind: str  # dcp | nemo | megatron | generic
    walk: Walk
    temp: bool = False  # generic, still under its temporary name
    marker_mtime: float | None = None  # NeMo: the -unfinished marker (the save's start)
    completed_at: float | None = None  # the completion marker's mtime, when there is one
    complete_by_marker: bool = False  # DCP/Megatron/NeMo said it is done


@dataclass(frozen=True)
class Save:
    name: str
    kind: str
    start: float
    end: float
    size: int


@dataclass
class RootState:
    """What the collector knows about one root across runs."""

    label: str  # the host path, as reported
    path: str  # where this agent reaches it
    spec: RootSpec
    mode: str = "poll"  # how it should be watched: inotify | poll
    lock: threading.Lock = field(default_factory=threading.Lock)
    first_seen: dict[str, float] = field(default_factory=dict)  # save name -> first trace (clock)
    dirty: bool = True  # inotify: events since the last scan
    last_scan: float | None = None
    observations: dict[str, Observation] = field(default_factory=dict)
    names_at_first_listing: set[str] | None = None
    seen_in_progress: set[str] = field(default_factory=set)
    nemo_names: set[str] = field(default_factory=set)  # saves seen with a NeMo marker
    renamed: set[str] = field(default_factory=set)  # generic saves seen under a temporary name
    completed: dict[str, Save] = field(default_factory=dict)  # name -> the save as it completed
    saves_total: int = 0
    last: Save | None = None
    readable: bool = True
    error: str = ""
    truncated: bool = False
    current: Observation | None = None  # the save in progress now, if any
    current_start: float | None = None
    watch_handle: Any = None  # the inotify watch while there is one

    @property
    def watch(self) -> str:
        """How it is watched right now: inotify only while a watch is in place."""
        return "inotify" if self.watch_handle is not None else "poll"

    def note(self, name: str, when: float) -> None:
        """A trace of save ``name`` seen at ``when`` (from a scan or an inotify event)."""
        with self.lock:
            self.first_seen.setdefault(name, when)


class CheckpointCollector(Collector):
    name = "checkpoint"
    help = "Checkpoint saves under configured roots: in progress, completed, duration, size, stalls."
    default_interval = 15.0
    metrics = (
        INFO,
        SAVES,
        IN_PROGRESS,
        LAST_SUCCESS,
        LAST_DURATION,
        LAST_SIZE,
        LAST_THROUGHPUT,
        EXPECTED_INTERVAL,
        READABLE,
        TRUNCATED,
        ROOTS,
    )
    options = (
        Option(
            "roots",
            parse_roots,
            (),
            "checkpoint root patterns (host paths; mappings add expected_interval, watch, quiet_period)",
            flag="--checkpoint.root",
            repeatable=True,
        ),
        Option("max_files", parse_positive_int, DEFAULT_MAX_FILES, "files a scan of one root stats at most"),
        Option(
            "job_id_pattern",
            parse_regex_with_group,
            DEFAULT_JOB_ID_PATTERN,
            "regular expression whose group captures the Slurm job id in a root's path",
        ),
    )

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.specs: tuple[RootSpec, ...] = context.options.get("roots", ())
        self.max_files: int = context.options.get("max_files", DEFAULT_MAX_FILES)
        self.job_id_re = re.compile(context.options.get("job_id_pattern", DEFAULT_JOB_ID_PATTERN))
        # Wall clock; the simulated node and the tests set their own.
        self.clock: Callable[[], float] = context.seams.wall_clock or time.time
        self.roots: dict[str, RootState] = {}  # label -> state
        self._observer: Any = None
        self._closed = False

    # --- roots and watching ---

    def host_path(self, label: str) -> str:
        return str(self.paths.rootfs / label.lstrip("/"))

    def resolve(self, spec: RootSpec) -> list[str]:
        """The root labels (host paths) a pattern matches now; a plain path always 'matches'."""
        if not glob.has_magic(spec.pattern):
            return [spec.pattern.rstrip("/") or "/"]
        labels = []
        for path in sorted(glob.glob(self.host_path(spec.pattern.rstrip("/")))):
            if os.path.isdir(path):
                relative = os.path.relpath(path, self.paths.rootfs)
                labels.append("/" if relative == "." else "/" + relative)
        return labels

    def _mount_fstype(self, label: str) -> str | None:
        """The filesystem type the host path is on, from the mount table (longest mountpoint)."""
        from lockstep.collectors.filesystem import parse_mountinfo  # the same table the filesystem collector reads

        for name in ("1", "self"):
            try:
                mounts, _ = parse_mountinfo(read_text(self.paths.procfs / name / "mountinfo"))
                break
            except OSError:
                continue
        else:
            return None
        best: tuple[int, str] | None = None
        for mount in mounts:
            mp = mount.mountpoint.rstrip("/")
            if label == mp or label.startswith(mp + "/") or mp == "":
                if best is None or len(mp) >= best[0]:
                    best = (len(mp), mount.fstype)
        return best[1] if best else None

    def _watch_mode(self, spec: RootSpec, label: str) -> str:
        if spec.watch != "auto":
            return spec.watch
        fstype = self._mount_fstype(label)
        if fstype is not None and (fstype in NETWORK_FSTYPES or fstype.startswith("fuse")):
            return "poll"
        return "inotify"

    def _start_watch(self, state: RootState) -> None:
        """Watch the root with inotify; a root that cannot be watched (inotify limits) is polled."""
        from watchdog.events import (
            DirCreatedEvent,
            DirDeletedEvent,
            DirMovedEvent,
            FileClosedEvent,
            FileCreatedEvent,
            FileDeletedEvent,
            FileMovedEvent,
            FileSystemEvent,
            FileSystemEventHandler,
        )
        from watchdog.observers import Observer

        root = state.path.rstrip("/")
        clock = self.clock

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                now = clock()
                for raw in (event.src_path, getattr(event, "dest_path", "")):
                    path = os.fsdecode(raw)
                    if path.startswith(root + "/"):
                        name = path[len(root) + 1 :].split("/", 1)[0]
                        if name.endswith(NEMO_MARKER_SUFFIX):
                            name = name[: -len(NEMO_MARKER_SUFFIX)]
                        state.note(final_name(name)[0], now)
                with state.lock:
                    state.dirty = True

        if self._observer is None:
            # watchdog warns when a new subdirectory's watch is added twice (by its creation
            # event and by its own recursive walk), a harmless race of its own: not for operators.
            warnings.filterwarnings("ignore", "Callback with id", RuntimeWarning, r"watchdog\.")
            self._observer = Observer()
            self._observer.daemon = True
            self._observer.start()
        # Creations, deletions, renames and closes after writing: one event per file written,
        # not one per write() (IN_MODIFY would flood the handler during a save).
        events = [
            FileCreatedEvent,
            DirCreatedEvent,
            FileDeletedEvent,
            DirDeletedEvent,
            FileMovedEvent,
            DirMovedEvent,
            FileClosedEvent,
        ]
        try:
            state.watch_handle = self._observer.schedule(Handler(), root, recursive=True, event_filter=events)
        except OSError as exc:
            self.log.warning("cannot watch %s with inotify (%s): polling it instead", state.label, describe_error(exc))
            state.mode = "poll"

    def _stop_watch(self, state: RootState) -> None:
        if state.watch_handle is not None and self._observer is not None:
            try:
                self._observer.unschedule(state.watch_handle)
            except (KeyError, OSError):
                pass
            state.watch_handle = None

    def close(self) -> None:
        self._closed = True
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None

    # --- a run ---

    def collect(self) -> Iterator[Metric]:
        if not self.specs:
            raise NothingHere("no checkpoint roots configured (collectors.checkpoint.roots or --checkpoint.root)")
        now = self.clock()
        roots_family = ROOTS.family()
        current: dict[str, tuple[RootSpec, str]] = {}
        for spec in self.specs:
            labels = self.resolve(spec)
            roots_family.add_metric([spec.pattern], len(labels))
            for label in labels:
                current.setdefault(label, (spec, spec.pattern))
        for label in list(self.roots):
            if label not in current:  # a job's directory removed: forget it
                self._stop_watch(self.roots.pop(label))
        for label, (spec, _pattern) in current.items():
            state = self.roots.get(label)
            if state is None:
                state = RootState(label=label, path=self.host_path(label), spec=spec)
                state.mode = self._watch_mode(spec, label)
                self.roots[label] = state
            if state.mode == "inotify" and state.watch_handle is None and os.path.isdir(state.path):
                self._start_watch(state)  # before the scan, so no event falls between the two
            self._update(state, now)
        yield from self._families(current, now)
        yield roots_family

    def _update(self, state: RootState, now: float) -> None:
        with state.lock:
            dirty = state.dirty
            state.dirty = False
        due = (
            state.watch == "poll"
            or dirty
            or state.last_scan is None
            or not state.readable
            or now - state.last_scan >= RESYNC_SECONDS
        )
        if due:
            try:
                state.observations = self._scan(state, now)
                state.last_scan = now
                if not state.readable:
                    self.log.info("checkpoint root %s readable again", state.label)
                state.readable, state.error = True, ""
            except OSError as exc:
                error = describe_error(exc)
                if state.readable or error != state.error:
                    self.log.warning("checkpoint root %s: %s", state.label, error)
                state.readable, state.error = False, error
                state.observations = {}
                self._stop_watch(state)  # a vanished directory's watch is dead; a new one starts when it is back
                return
        self._evaluate(state, now)

    def _scan(self, state: RootState, now: float) -> dict[str, Observation]:
        """List the root and walk its saves (those not already known complete), within max_files."""
        budget = Budget(self.max_files)
        entries: dict[str, os.DirEntry[str]] = {}
        with os.scandir(state.path) as listing:
            for entry in listing:
                if not budget.take():
                    break
                entries[entry.name] = entry
        if state.names_at_first_listing is None:
            state.names_at_first_listing = {final_name(n)[0] for n in entries}
        megatron = MEGATRON_TRACKER in entries or any(MEGATRON_ITERATION.match(n) for n in entries)
        observations: dict[str, Observation] = {}
        # Newest first, so a capped scan spends its budget on the saves that matter.
        ordered = sorted(entries.values(), key=_mtime_or_zero, reverse=True)
        if megatron:
            tracker = _read_tracker(state.path)
            for entry in ordered:
                match = MEGATRON_ITERATION.match(entry.name)
                if match and entry.is_dir(follow_symlinks=False):
                    obs = self._observe(state, entry.name, "megatron", entry.path, budget, now)
                    if obs is not None and tracker is not None and int(match.group(1)) <= tracker[0]:
                        obs.complete_by_marker = True
                        # The tracker's mtime is this save's end only if it names this save.
                        obs.completed_at = tracker[1] if int(match.group(1)) == tracker[0] else None
                    if obs is not None:
                        observations[entry.name] = obs
        else:
            markers = {n[: -len(NEMO_MARKER_SUFFIX)]: e for n, e in entries.items() if n.endswith(NEMO_MARKER_SUFFIX)}
            state.nemo_names |= set(markers)
            members = {name + suffix: name for name in state.nemo_names for suffix in NEMO_MEMBER_SUFFIXES}
            nemo_paths: dict[str, list[str]] = {}
            for entry in ordered:
                if entry.name in NOT_SAVES or entry.name.endswith(NEMO_MARKER_SUFFIX):
                    continue
                if entry.name in members:
                    nemo_paths.setdefault(members[entry.name], []).append(entry.path)
                    continue
                name, temp = final_name(entry.name)
                if entry.name.startswith(".") and not temp:
                    continue  # hidden files (.nfs silly-renames, editors' files) are not saves
                if temp:
                    state.renamed.add(name)
                obs = self._observe(state, name, "generic", entry.path, budget, now)
                if obs is None:
                    continue
                obs.temp = temp
                if obs.walk.metadata_mtime is not None or obs.walk.has_shards:
                    obs.kind = "dcp"
                    obs.completed_at = obs.walk.metadata_mtime
                    obs.complete_by_marker = obs.walk.metadata_mtime is not None
                observations[name] = obs
            for name in state.nemo_names:
                marker = markers.get(name)
                obs = self._observe_nemo(state, name, nemo_paths.get(name, []), marker, budget, now)
                if obs is not None:
                    observations[name] = obs
            # Forget NeMo saves that are gone altogether.
            state.nemo_names = {n for n in state.nemo_names if n in markers or n in nemo_paths}
        state.truncated = budget.exhausted
        return observations

    def _observe(
        self, state: RootState, name: str, kind: str, path: str, budget: Budget, now: float
    ) -> Observation | None:
        state.note(name, now)
        known = state.completed.get(name)
        if known is not None:
            # Already complete: re-walking it every run would cost a stat per file. Its
            # directory's mtime changes when files are added or removed (a save rewritten).
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                return None
            previous = state.observations.get(name)
            if previous is not None and previous.walk.own_mtime == st.st_mtime:
                return previous
        try:
            return Observation(name, kind, walk(path, budget))
        except OSError:
            return None  # removed between listing and walking

    def _observe_nemo(
        self,
        state: RootState,
        name: str,
        paths: list[str],
        marker: os.DirEntry[str] | None,
        budget: Budget,
        now: float,
    ) -> Observation | None:
        previous = state.observations.get(name)
        if marker is None and name in state.completed and previous is not None:
            return previous  # complete and not being rewritten (no new marker): no need to walk it again
        combined = Walk()
        for path in paths:
            try:
                part = walk(path, budget)
            except OSError:
                continue
            combined.files += part.files
            combined.size += part.size
            combined.truncated |= part.truncated
            if part.oldest_mtime is not None:
                old = combined.oldest_mtime
                combined.oldest_mtime = part.oldest_mtime if old is None else min(old, part.oldest_mtime)
            if part.newest_mtime is not None:
                new = combined.newest_mtime
                combined.newest_mtime = part.newest_mtime if new is None else max(new, part.newest_mtime)
            combined.own_mtime = max(combined.own_mtime, part.own_mtime)
        obs = Observation(name, "nemo", combined)
        if marker is not None:
            try:
                obs.marker_mtime = marker.stat(follow_symlinks=False).st_mtime
            except OSError:
                marker = None
        if marker is None:
            if not paths:
                return None
            obs.complete_by_marker = True
        state.note(name, now)
        return obs

    # --- evaluating what the scan saw ---

    def _start(self, state: RootState, obs: Observation) -> float:
        """The earliest trace of the save, kept across scans (a NeMo marker is gone by the end)."""
        with state.lock:
            candidates = [state.first_seen.get(obs.name, float("inf"))]
            if obs.marker_mtime is not None:
                candidates.append(obs.marker_mtime)
            if obs.walk.oldest_mtime is not None:
                candidates.append(obs.walk.oldest_mtime)
            elif obs.walk.files == 0:
                candidates.append(obs.walk.own_mtime)  # an empty directory: made when the save began
            state.first_seen[obs.name] = start = min(candidates)
        return start

    def _end(self, state: RootState, obs: Observation) -> float:
        if obs.completed_at is not None:
            return obs.completed_at
        newest = obs.walk.newest_mtime if obs.walk.newest_mtime is not None else obs.walk.own_mtime
        if obs.kind == "generic" and obs.name in state.renamed:
            return max(newest, obs.walk.own_ctime)  # renamed from its temporary name: renaming sets ctime
        return newest

    def _is_complete(self, state: RootState, obs: Observation, now: float) -> bool:
        if obs.kind in ("dcp", "megatron", "nemo"):
            return obs.complete_by_marker
        if obs.temp or obs.walk.files == 0:
            return False  # still under its temporary name, or nothing written yet
        if obs.name in state.renamed:
            return True  # appeared by an atomic rename from a temporary name
        return now - self._end(state, obs) >= state.spec.quiet_period

    def _evaluate(self, state: RootState, now: float) -> None:
        """Which saves are complete, which one is in progress, and count completions."""
        baseline = state.names_at_first_listing or set()
        in_progress: list[tuple[float, Observation]] = []
        for name, obs in state.observations.items():
            start = self._start(state, obs)
            if not self._is_complete(state, obs, now):
                state.completed.pop(name, None)
                in_progress.append((start, obs))
                continue
            save = Save(name, obs.kind, start, max(self._end(state, obs), start), obs.walk.size)
            previous = state.completed.get(name)
            if previous is not None and previous.end == save.end:
                continue
            state.completed[name] = save
            # Saves already complete when the agent first listed the root are history, not new saves.
            if name in state.seen_in_progress or name not in baseline:
                state.saves_total += 1
            if state.last is None or save.end >= state.last.end:
                state.last = save
        # Forget what is gone from the root (retention deleted it).
        listed = state.observations.keys()
        state.completed = {n: save for n, save in state.completed.items() if n in listed}
        state.seen_in_progress &= listed
        state.renamed &= listed
        with state.lock:
            for name in [n for n in state.first_seen if n not in state.observations]:
                # An inotify event may run ahead of the scan that lists the save: keep it a while.
                if now - state.first_seen[name] > RESYNC_SECONDS:
                    del state.first_seen[name]
        # An incomplete save older than the newest completed one is a crashed job's leftover.
        newest_complete_start = max((s.start for s in state.completed.values()), default=float("-inf"))
        current = [(start, obs) for start, obs in in_progress if start > newest_complete_start]
        for _start, obs in current:
            state.seen_in_progress.add(obs.name)
        state.current_start, state.current = max(current, key=lambda pair: pair[0], default=(None, None))

    def job_id(self, state: RootState) -> str:
        for text in (state.label, state.last.name if state.last else ""):
            match = self.job_id_re.search(text)
            if match:
                return match.group(1)
        return ""

    def _families(self, current: dict[str, tuple[RootSpec, str]], now: float) -> Iterator[Metric]:
        info, saves, in_progress, last_success, last_duration, last_size, throughput, expected, readable, truncated = (
            INFO.family(),
            SAVES.family(),
            IN_PROGRESS.family(),
            LAST_SUCCESS.family(),
            LAST_DURATION.family(),
            LAST_SIZE.family(),
            LAST_THROUGHPUT.family(),
            EXPECTED_INTERVAL.family(),
            READABLE.family(),
            TRUNCATED.family(),
        )
        for label, (spec, pattern) in sorted(current.items()):
            state = self.roots[label]
            newest = state.current or state.last
            info.add_metric([label, pattern, self.job_id(state), newest.kind if newest else "unknown", state.watch], 1)
            saves.add_metric([label], state.saves_total)
            started = state.current_start if state.readable else None
            # Clamped: a network filesystem's mtimes come from the server's clock, which may run ahead.
            in_progress.add_metric([label], max(0.0, now - started) if started is not None else 0.0)
            if state.last is not None:
                duration = state.last.end - state.last.start
                last_success.add_metric([label], state.last.end)
                last_duration.add_metric([label], duration)
                last_size.add_metric([label], state.last.size)
                if duration > 0:
                    throughput.add_metric([label], state.last.size / duration)
            if spec.expected_interval is not None:
                expected.add_metric([label], spec.expected_interval)
            readable.add_metric([label], int(state.readable))
            truncated.add_metric([label], int(state.truncated))
        yield from (info, saves, in_progress, last_success, last_duration, last_size, throughput, expected)
        yield from (readable, truncated)


def _mtime_or_zero(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _read_tracker(root: str) -> tuple[int, float] | None:
    """Megatron's latest_checkpointed_iteration.txt: (iteration, mtime); None if absent or 'release'."""
    path = os.path.join(root, MEGATRON_TRACKER)
    try:
        text = read_text(path).strip()
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    return (int(text), mtime) if text.isdigit() else None
