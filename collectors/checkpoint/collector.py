"""The checkpoint collector: resolves the root patterns, watches each root (inotify) or polls
it, scans and evaluates it (scan.py, evaluate.py) and reports its saves."""

from __future__ import annotations

import glob
import os
import re
import time
from collections.abc import Callable, Iterator

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere, describe_error
from lockstep.agent.families import Metric
from lockstep.agent.files import read_text
from lockstep.agent.seams import WALL_CLOCK
from lockstep.collectors.checkpoint.config import RESYNC_SECONDS, CheckpointOptions, RootSpec
from lockstep.collectors.checkpoint.evaluate import evaluate
from lockstep.collectors.checkpoint.markers import NEMO_MARKER_SUFFIX, final_name
from lockstep.collectors.checkpoint.metrics import (
    EXPECTED_INTERVAL,
    IN_PROGRESS,
    INFO,
    LAST_DURATION,
    LAST_SIZE,
    LAST_SUCCESS,
    LAST_THROUGHPUT,
    READABLE,
    ROOTS,
    SAVES,
    SKIPPED_DIRECTORIES,
    TRUNCATED,
)
from lockstep.collectors.checkpoint.scan import scan
from lockstep.collectors.checkpoint.state import RootState
from lockstep.collectors.checkpoint.watch import TreeWatcher
from lockstep.collectors.toolkit.mounts import parse_mountinfo

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


class CheckpointCollector(Collector[CheckpointOptions]):
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
        SKIPPED_DIRECTORIES,
        ROOTS,
    )
    options_class = CheckpointOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.job_id_re = re.compile(self.options.job_id_pattern)
        # Wall clock; the simulated node and the tests set their own.
        self.clock: Callable[[], float] = context.seams.get(WALL_CLOCK) or time.time
        self.roots: dict[str, RootState] = {}  # label -> state
        self._watcher: TreeWatcher | None = None
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

    def _storage(self, label: str) -> str:
        """Whether the root is this node's own ("local") or on a filesystem other nodes write
        ("shared": network filesystems and FUSE mounts, which are mostly remote), "" when the
        mount table cannot be read.  The rules name a node-local root's stalled save's node as
        its slow writer even when other nodes' roots of the same path stall at the same time."""
        fstype = self._mount_fstype(label)
        if fstype is None:
            return ""
        return "shared" if fstype in NETWORK_FSTYPES or fstype.startswith("fuse") else "local"

    def _watch_mode(self, spec: RootSpec, storage: str) -> str:
        if spec.watch != "auto":
            return spec.watch
        return "poll" if storage == "shared" else "inotify"

    def _start_watch(self, state: RootState) -> None:
        """Watch the root with inotify, at most max_watch_depth levels down (watch.py); a root
        that cannot be watched (inotify limits) is polled."""
        root = state.path.rstrip("/")
        clock = self.clock

        def on_event(path: str) -> None:  # in the watcher's thread
            if path.startswith(root + "/"):
                name = path[len(root) + 1 :].split("/", 1)[0]
                if name.endswith(NEMO_MARKER_SUFFIX):
                    name = name[: -len(NEMO_MARKER_SUFFIX)]
                state.note(final_name(name)[0], clock())
            with state.lock:
                state.dirty = True

        try:
            if self._watcher is None:
                self._watcher = TreeWatcher(self.options.max_watch_depth)
            state.watched_id = _directory_id(root)
            state.watch_handle = self._watcher.watch(root, on_event)
        except OSError as exc:
            self.log.warning("cannot watch %s with inotify (%s): polling it instead", state.label, describe_error(exc))
            state.mode = "poll"
            return
        if state.watch_handle.cut:
            self.log.warning(
                "checkpoint root %s: the subdirectories of %d directories %d levels down are not watched "
                "(max_watch_depth)",
                state.label,
                state.watch_handle.cut,
                self.options.max_watch_depth,
            )

    def _stop_watch(self, state: RootState) -> None:
        if state.watch_handle is not None and self._watcher is not None:
            self._watcher.unwatch(state.watch_handle)
        state.watch_handle = None

    def close(self) -> None:
        self._closed = True
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    # --- a run ---

    def collect(self) -> Iterator[Metric]:
        if not self.options.roots:
            raise NothingHere("no checkpoint roots configured (collectors.checkpoint.roots or --checkpoint.root)")
        now = self.clock()
        families = Families(self.metrics)
        current: dict[str, tuple[RootSpec, str]] = {}
        for spec in self.options.roots:
            labels = self.resolve(spec)
            families[ROOTS].add_metric([spec.pattern], len(labels))
            for label in labels:
                current.setdefault(label, (spec, spec.pattern))
        for label in list(self.roots):
            if label not in current:  # a job's directory removed: forget it
                self._stop_watch(self.roots.pop(label))
        for label, (spec, _pattern) in current.items():
            state = self.roots.get(label)
            if state is None:
                state = RootState(label=label, path=self.host_path(label), spec=spec, storage=self._storage(label))
                state.mode = self._watch_mode(spec, state.storage)
                self.roots[label] = state
            if state.watch_handle is not None and _directory_id(state.path) != state.watched_id:
                # The root was replaced (rename + mkdir, or removed and made again): the watch
                # is on the old directory and sees nothing of the new one.  Watch the new one
                # and scan it now, not at the next resync minutes later.
                self.log.info("checkpoint root %s was replaced: watching the new directory", state.label)
                self._stop_watch(state)
                with state.lock:
                    state.dirty = True
            if state.mode == "inotify" and state.watch_handle is None and os.path.isdir(state.path):
                self._start_watch(state)  # before the scan, so no event falls between the two
            self._update(state, now)
        self._fill(families, current, now)
        yield from families.all()  # every family, those without samples too, as before

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
                state.observations = scan(state, now, self.options.max_files)
                if state.tracker_error != state.tracker_error_logged:  # once per change
                    if state.tracker_error:
                        self.log.warning(
                            "checkpoint root %s: skipping the tracker: %s", state.label, state.tracker_error
                        )
                    state.tracker_error_logged = state.tracker_error
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
        evaluate(state, now)

    def job_id(self, state: RootState) -> str:
        for text in (state.label, state.last.name if state.last else ""):
            match = self.job_id_re.search(text)
            if match:
                return match.group(1)
        return ""

    def _fill(self, families: Families, current: dict[str, tuple[RootSpec, str]], now: float) -> None:
        for label, (spec, pattern) in sorted(current.items()):
            state = self.roots[label]
            newest = state.current or state.last
            families[INFO].add_metric(
                [label, pattern, self.job_id(state), newest.kind if newest else "unknown", state.watch, state.storage],
                1,
            )
            families[SAVES].add_metric([label], state.saves_total)
            started = state.current_start if state.readable else None
            # Clamped: a network filesystem's mtimes come from the server's clock, which may run ahead.
            families[IN_PROGRESS].add_metric([label], max(0.0, now - started) if started is not None else 0.0)
            if state.last is not None:
                duration = state.last.end - state.last.start
                families[LAST_SUCCESS].add_metric([label], state.last.end)
                families[LAST_DURATION].add_metric([label], duration)
                families[LAST_SIZE].add_metric([label], state.last.size)
                if duration > 0:
                    families[LAST_THROUGHPUT].add_metric([label], state.last.size / duration)
            if spec.expected_interval is not None:
                families[EXPECTED_INTERVAL].add_metric([label], spec.expected_interval)
            families[READABLE].add_metric([label], int(state.readable))
            families[TRUNCATED].add_metric([label], int(state.truncated))
            cut = state.watch_handle.cut if state.watch_handle is not None else 0
            families[SKIPPED_DIRECTORIES].add_metric([label], cut)


def _directory_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
