"""The logs a collector follows by glob, from its first round to its close, and their options.

The training, framework_logs and NCCL Inspector collectors follow growing files by glob
(follow.py reads them).  Around the reading they all need the same lifecycle, and a
``FollowedLogs`` owns it, so that it is written once:

- the lock: a collector's round and the watchdog thread both read the files (a FileFollower is
  not thread-safe) and both change the collector's state from what they read, so one lock
  serialises them; the collector's own work on that state happens under it too (``swept``);
- the FileFollower: made at the first round, not when the collector is built (construction
  does no I/O), with the ``start_at`` option saying whether the files present then are read
  from their end or their beginning; given the round's globs at every round (framework_logs
  finds its files anew);
- the sweep: each round hands every line appended since the last one to ``on_lines``;
- the watch: after each round the DirectoryWatcher is pointed at the followed files'
  directories again (new files and run directories appear), and each file event reads that
  file at once, handing its lines to ``on_lines`` too; a close after a write goes to
  ``on_closed``.  Where the kernel refuses a watch (the inotify limit), a warning, once per
  change, and the sweep alone reads the files.  ``watch=False`` follows by sweeps only;
- the close order: watcher and follower are taken out under the lock (an event from then on
  reads nothing), the watcher is stopped outside it (its thread may be waiting for our lock),
  and the follower's descriptors are closed last.

The options the three collectors declare alike are made here too, so their defaults, parse
functions and wording are written once: ``globs_option`` (which files), ``start_at_option``
and ``idle_timeout_option``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from lockstep.agent.options import option, parse_choice, parse_duration, parse_string_list
from lockstep.collectors.toolkit.follow import (
    MAX_LINE_BYTES,
    READ_BUDGET,
    SWEEP_BUDGET,
    DirectoryWatcher,
    FileFollower,
    Line,
)

# The values of the start_at option: read the files present at the first round from their end
# (a restarted agent does not replay their history) or from their beginning.
START_AT = ("end", "beginning")


def globs_option(files: str, *, flag: str, more: str = "") -> tuple[str, ...]:
    """The option holding the globs of the files to follow, e.g. ``files="per-rank logs"``;
    ``more`` is said after the shared wording (e.g. how a file's job is told)."""
    return option(
        (),
        parse_string_list,
        f"glob of {files}, on the host (under --path.rootfs), ** allowed{more}",
        flag=flag,
        repeatable=True,
    )


def start_at_option(files: str, *, flag: str | None = None) -> str:
    """The option saying where to start reading ``files`` (e.g. "log files") present at start."""
    return option(
        "end",
        parse_choice(START_AT),
        f"where to start reading the {files} present when the agent starts: end (skip their history) or beginning",
        flag=flag,
    )


def idle_timeout_option(help: str) -> float:
    """The option saying how long what the logs describe (a rank, a job) may be silent before it
    is dropped; ``help`` says what is dropped, and when."""
    return option(600.0, parse_duration, help)


class FollowedLogs:
    """Files matching globs under ``root`` (``--path.rootfs``), followed from a collector's first
    round to its close (see the module doc for what this owns).

    ``on_lines`` takes the lines of a sweep or of a file event, and is always called under
    ``lock``.  ``on_closed(path)`` (under ``lock`` too) is told when a process closed a file it
    wrote (IN_CLOSE_WRITE).  ``what`` names the files' directories in the warning about
    watches ("log": "cannot watch log directories").  The other arguments are the
    FileFollower's, with its defaults.
    """

    def __init__(
        self,
        root: Path,
        *,
        start_at: str,
        on_lines: Callable[[Iterable[Line]], None],
        log: logging.Logger,
        watch: bool = True,
        on_closed: Callable[[str], None] | None = None,
        what: str = "log",
        max_line_bytes: int = MAX_LINE_BYTES,
        read_budget: int = READ_BUDGET,
        sweep_budget: int = SWEEP_BUDGET,
        max_files: int | None = None,
        directory_files: str | None = None,
        park_after: int | None = None,
    ) -> None:
        if start_at not in START_AT:
            raise ValueError(f"start_at is one of {', '.join(START_AT)}, not {start_at!r}")
        self.root = root
        self.start_at = start_at
        self.log = log
        self.watch = watch
        self.what = what
        self.max_line_bytes = max_line_bytes
        self.read_budget = read_budget
        self.sweep_budget = sweep_budget
        self.max_files = max_files
        self.directory_files = directory_files
        self.park_after = park_after
        self.lock = threading.Lock()
        self._on_lines = on_lines
        self._on_closed = on_closed
        self._follower: FileFollower | None = None
        self._watcher: DirectoryWatcher | None = None
        self._watch_problems: list[str] = []

    @property
    def started(self) -> bool:
        """Whether a round made the follower (and ``close`` has not closed it since)."""
        return self._follower is not None

    @property
    def watched(self) -> set[str]:
        """The directories watched now."""
        return self._watcher.directories if self._watcher is not None else set()

    def begin(self) -> None:
        """Make the follower now, following nothing yet (a collector that found nothing to
        follow at its first round): ``start_at`` applies to the files present at this first,
        empty sweep, i.e. to none, and files found later are new to it, read from their start."""
        with self.lock:
            if self._follower is None:
                self._follower = self._new_follower((), start_at_end=self.start_at == "end")
                for _line in self._follower.sweep():
                    pass  # no pattern: nothing

    @contextmanager
    def swept(self, patterns: Sequence[str]) -> Iterator[FileFollower]:
        """One round: under the lock, follow ``patterns`` (the follower is made at the first
        round), hand what was appended to every followed file to ``on_lines``, and give the
        follower to the ``with`` block, for the caller's work on its state and the follower's
        counters.  After the block, outside the lock, the watch is pointed at the followed
        files' directories: watchdog's dispatcher holds its own lock while it calls our event
        handler, which takes ours, so watching under our lock could deadlock."""
        with self.lock:
            if self._follower is None:
                self._follower = self._new_follower(patterns, start_at_end=self.start_at == "end")
            else:
                self._follower.set_patterns(patterns, self.root)
            self._on_lines(self._follower.sweep())
            yield self._follower
            directories = self._follower.directories()
        if self.watch:
            self._watch(directories)

    @contextmanager
    def probe(self, patterns: Sequence[str]) -> Iterator[FileFollower]:
        """A follower of ``patterns`` of its own, swept once and closed after the ``with``
        block, for a check (``lockstep doctor``): it reads the files present from their end,
        so it hands nothing over, and the rounds' follower is left as it is."""
        follower = self._new_follower(patterns, start_at_end=True)
        try:
            for _line in follower.sweep():
                pass  # files present now are followed from their end: nothing but context
            yield follower
        finally:
            follower.close()

    def close(self) -> None:
        """Stop watching and close every followed file.  Called from the collector's own thread,
        never with ``lock`` held."""
        with self.lock:
            watcher, self._watcher = self._watcher, None
            follower, self._follower = self._follower, None  # events from now on read nothing
        if watcher is not None:
            watcher.stop()  # not under our lock: its thread may be waiting for it (see swept)
        if follower is not None:
            follower.close()

    # --- internals ---

    def _new_follower(self, patterns: Sequence[str], start_at_end: bool) -> FileFollower:
        return FileFollower(
            patterns,
            self.root,
            start_at_end=start_at_end,
            max_line_bytes=self.max_line_bytes,
            read_budget=self.read_budget,
            sweep_budget=self.sweep_budget,
            max_files=self.max_files,
            log=self.log,
            directory_files=self.directory_files,
            park_after=self.park_after,
        )

    def _watch(self, directories: set[str]) -> None:
        """Point the watcher at ``directories`` (made at the first call).  From the collector's
        own thread only, never with our lock held (see swept)."""
        try:
            if self._watcher is None:
                on_closed = self._on_close_event if self._on_closed is not None else None
                self._watcher = DirectoryWatcher(self._on_event, on_closed)
            problems = self._watcher.watch(directories)
        except OSError as exc:
            problems = [str(exc)]
        # e.g. the inotify watch limit: the sweep every round still reads everything.
        if problems and problems != self._watch_problems:
            self.log.warning(
                "cannot watch %s directories, reading them every round only: %s", self.what, "; ".join(problems)
            )
        self._watch_problems = problems

    def _on_event(self, path: str) -> None:
        """From the watchdog thread: read the file now (growth, rotation, truncation)."""
        with self.lock:
            if self._follower is None:
                return  # closed
            try:
                self._on_lines(self._follower.read_path(path))
            except Exception as exc:  # never let one file kill the event thread; the sweep retries
                self.log.debug("reading %s after an event failed: %s", path, exc)

    def _on_close_event(self, path: str) -> None:
        """From the watchdog thread: a process closed ``path`` after writing to it."""
        assert self._on_closed is not None  # watched for closes only then
        with self.lock:
            if self._follower is None:
                return  # closed
            self._on_closed(path)
