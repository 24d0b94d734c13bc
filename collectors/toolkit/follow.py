"""Following growing line-oriented files matched by globs, as ``tail -F`` does.

Used by the training collector for per-rank JSON-lines logs and by the NCCL Inspector
collector for its dump files; nothing in here knows a record format.  A ``FileFollower``
returns the complete lines appended since the last call, and survives what log files go
through:

- files appearing later (new ranks, a restarted job): read from their first byte;
- growth: read from where the last read stopped, at most ``read_budget`` bytes per file
  per call, ``sweep_budget`` bytes per sweep and ``max_lines`` lines per call, so a huge
  backlog is worked off over several rounds instead of one long one;
- lines are handed over one at a time, as they are read (``sweep`` and ``read_path`` are
  generators): the caller parses each before the next is split off, so a round holds one
  read chunk and one line, never a list of every line in the budget (16 MiB of ``1\n`` was
  8 million objects);
- rotation by rename (logrotate ``create``, Python's RotatingFileHandler): files are
  followed by identity (device, inode) through an open descriptor, so the rest of the
  old file is still read after the rename and the new file at the old path is read from
  its start; a rotated name that still matches the glob is not read twice;
- truncation in place (``copytruncate``, ``> file``): the file became shorter than the
  read position, so reading restarts at 0;
- a partial last line (the writer is mid-``write``): kept until its newline arrives;
- over-long lines (garbage without newlines): dropped and counted, never buffered
  without bound;
- symlink loops under ``**``: not followed (``glob_files``); directories that cannot be
  listed (out of file descriptors) are reported, and their files are not taken for deleted;
- more files than ``max_files``: each followed file holds a descriptor, so at most
  ``max_files`` are open, whichever path opens them (a sweep or a file event); the default
  (``default_max_files``) is a quarter of the process's open-file limit, at most 1,024, so
  the collector can never take the descriptors the HTTP endpoint and the other collectors
  need; the rest are counted (``skipped``) and reported once per change.  With
  ``park_after`` (framework_logs: files anyone may create under a glob), a file that gave
  nothing for that many sweeps gives its descriptor up to a matching file with something to
  read: it is closed and its offset kept ("parked"), and it is read on from there when it grows
  (not from its start); an empty or parked file that did not grow waits without a descriptor
  and is not counted as skipped, so idle files cannot starve a live one;
- huge existing files: with ``start_at_end`` the files present at the first sweep are
  followed from their end (a partial line there is skipped), so a restarted agent does
  not replay gigabytes of history; the last complete line before that point is handed
  over once, marked ``context``, for the caller to recognise a unit already under way.

``DirectoryWatcher`` turns watchdog (inotify) events in the followed files' directories
into immediate reads, so growth, rotation and truncation are seen as they happen; the
periodic ``sweep`` (glob + read everything) is the backstop for what makes no local
event (writes from other nodes on NFS/Lustre, an inotify queue overflow).

Not thread-safe: the caller serialises ``sweep`` and ``read_path`` (one lock), and reads
each generator to its end before calling the next.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import logging
import os
import resource
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

FileId = tuple[int, int]  # (st_dev, st_ino)
_CHUNK = 1 << 20

# Lines handed over per sweep (and per file event) at most.  A real node's ranks log a few
# thousand lines per 15-s round (8 ranks x ~10 metrics x a few steps a second); a file of
# one-byte lines (`1\n`) would otherwise hand over 16 million per round, each parsed, which
# takes minutes.  What is left is read by the next round.
MAX_LINES = 200_000

# Files followed at most, whatever the open-file limit: each holds a descriptor.
MAX_FILES = 1024

# A FileFollower's bounds when its user sets none (FollowedLogs takes the same defaults): a line
# longer than MAX_LINE_BYTES is dropped, at most READ_BUDGET bytes are read from one file per
# call and SWEEP_BUDGET from all of them per sweep.
MAX_LINE_BYTES = 64 * 1024
READ_BUDGET = 16 * 1024 * 1024
SWEEP_BUDGET = 32 * 1024 * 1024


def default_max_files(share: int = 4) -> int:
    """How many log files may be open at once: 1/``share`` of the soft open-file limit, at most
    MAX_FILES.  The HTTP endpoint takes at most half of the limit (ServerLimits), the training
    logs a quarter, NCCL's Inspector dumps an eighth (share=8), so an eighth stays for the rest of
    the agent (other collectors, inotify, libraries) whatever is written."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_FILES
    return max(1, min(MAX_FILES, soft // share))


@dataclass
class _Budget:
    """What a sweep (or one file event) may still read."""

    bytes: int
    lines: int


class Line(NamedTuple):
    """One complete line (without its newline) and where it came from.  A tuple: made once
    per line read, so it is the cheapest object Python has."""

    file: FileId
    path: str
    data: bytes
    # True for the last complete line before where reading of a file started at its end
    # (start_at_end): not new data, but context, e.g. to recognise the rest of a unit (a
    # training step) whose beginning was skipped.
    context: bool = False


@dataclass
class _Followed:
    fd: int
    file: FileId
    path: str  # where it was last seen
    offset: int
    context: Line | None = None  # handed over with the first read
    partial: bytearray = field(default_factory=bytearray)
    discarding: bool = False  # dropping bytes up to the next newline (over-long or skipped partial line)
    quiet_orphan_sweeps: int = 0  # sweeps in a row in which it matched no glob and gave nothing
    idle_sweeps: int = 0  # sweeps in a row in which it gave nothing (park_after)


class FileFollower:
    """Follows the regular files matching ``patterns`` (host paths, ``**`` allowed).

    ``root`` is where the host's file system is (``--path.rootfs``): patterns are
    resolved under it.  Counters for the caller's metrics: ``lines_too_long``,
    ``truncations``, ``rotations``, ``skipped`` (matching files not followed at the last
    sweep: over ``max_files``).  At most ``max_files`` files are followed (each holds a
    descriptor open): more matching files are reported, never followed by closing others.
    ``directory_files`` (a name pattern, e.g. ``*-pid*.log``): a directory a pattern matches
    stands for its files of that name, for formats whose writer owns a directory (NCCL's
    Inspector); without it (None) a directory is nothing to read.
    """

    # An orphan (rotated away or deleted) is closed after this many sweeps without new
    # data: a writer may append a little to the old file before it reopens its path.
    ORPHAN_SWEEPS = 2

    def __init__(
        self,
        patterns: Sequence[str],
        root: Path = Path("/"),
        *,
        start_at_end: bool,
        max_line_bytes: int = MAX_LINE_BYTES,
        read_budget: int = READ_BUDGET,
        sweep_budget: int = SWEEP_BUDGET,
        max_lines: int = MAX_LINES,
        max_files: int | None = None,
        log: logging.Logger | None = None,
        directory_files: str | None = None,
        park_after: int | None = None,
    ) -> None:
        self.patterns = tuple(_under(root, p) for p in patterns)
        self.park_after = park_after
        # Files closed to free their descriptor (park_after): where to read them on from.
        self._parked: dict[FileId, int] = {}
        self.directory_files = directory_files
        self.start_at_end = start_at_end
        self.max_line_bytes = max_line_bytes
        self.read_budget = read_budget
        self.sweep_budget = sweep_budget
        self.log = log or logging.getLogger(__name__)
        self._files: dict[FileId, _Followed] = {}
        self._swept = False
        self.max_lines = max_lines
        self.max_files = default_max_files() if max_files is None else max_files
        self.skipped = 0
        self.lines_too_long = 0
        self.truncations = 0
        self.rotations = 0
        self.problems: list[str] = []  # what the last sweep could not do, in words

    # --- what is followed ---

    def set_patterns(self, patterns: Sequence[str], root: Path = Path("/")) -> None:
        """Follow these patterns from now on (a collector that discovers its files).  Files that
        no longer match are drained and closed by the sweeps, as rotated-away files are; files
        matched for the first time after the first sweep are read from their start."""
        self.patterns = tuple(_under(root, p) for p in patterns)

    @property
    def followed(self) -> int:
        return len(self._files)

    def followed_paths(self) -> list[str]:
        """Where each followed file was last seen."""
        return [f.path for f in self._files.values()]

    def matches(self, path: str) -> bool:
        """Whether ``path`` matches one of the patterns, with glob's rules, or is a file named
        ``directory_files`` in a directory that does."""
        parts = _parts(path)
        if any(_match(_parts(pattern), parts) for pattern in self.patterns):
            return True
        return (
            self.directory_files is not None
            and fnmatch.fnmatchcase(os.path.basename(path), self.directory_files)
            and any(_match(_parts(pattern), parts[:-1]) for pattern in self.patterns)
        )

    def directories(self) -> set[str]:
        """Directories worth watching: those of followed files, and each pattern's
        deepest existing directory without wildcards (where new files or run
        directories appear)."""
        found = {os.path.dirname(f.path) for f in self._files.values()}
        for pattern in self.patterns:
            static = []
            for part in _parts(pattern)[:-1]:
                if glob.has_magic(part):
                    break
                static.append(part)
            directory = os.path.join("/", *static)
            if os.path.isdir(directory):  # when it appears, a sweep finds what is in it
                found.add(directory)
        return found

    # --- reading ---

    def sweep(self) -> Iterator[Line]:
        """Find the files matching the patterns now and read what was appended to every
        followed file (including rotated-away ones still being drained), one line at a time."""
        found: dict[FileId, str] = {}
        problems: list[str] = []
        complete = True  # every directory on the way could be listed
        for pattern in self.patterns:
            globbed = glob_files(pattern)
            problems += globbed.errors
            if globbed.truncated:
                problems.append(f"{pattern}: stopped after listing {MAX_GLOB_DIRECTORIES} directories")
            complete = complete and not globbed.errors and not globbed.truncated
            known_problems = len(problems)
            for path in globbed.paths:
                st = self._stat(path, problems)
                if st is not None and stat.S_ISREG(st.st_mode):
                    found.setdefault((st.st_dev, st.st_ino), path)
                elif st is not None and stat.S_ISDIR(st.st_mode) and self.directory_files is not None:
                    inner = glob_files(os.path.join(glob.escape(path), self.directory_files))
                    problems += inner.errors
                    for inner_path in inner.paths:
                        inner_st = self._stat(inner_path, problems)
                        if inner_st is not None and stat.S_ISREG(inner_st.st_mode):
                            found.setdefault((inner_st.st_dev, inner_st.st_ino), inner_path)
            complete = complete and len(problems) == known_problems
        budget = _Budget(self.sweep_budget, self.max_lines)
        if complete:  # parked files gone for good: a new file with the same inode starts afresh
            for file in [file for file in self._parked if file not in found]:
                del self._parked[file]
        # Files that no longer match (rotated out of the pattern, deleted) first: what was
        # written to them came before what is in the files that took their place.
        for file, followed in list(self._files.items()):
            if file in found:
                continue
            if not complete:
                # Not listed this time is not gone (a directory could not be read, e.g. out of
                # file descriptors): closing it would read it again from the start later.
                continue
            before = budget.bytes
            yield from self._read(followed, budget)
            followed.quiet_orphan_sweeps = 0 if budget.bytes < before else followed.quiet_orphan_sweeps + 1
            if followed.quiet_orphan_sweeps >= self.ORPHAN_SWEEPS:
                yield from self._close(followed)
        out_of_descriptors = 0
        skipped = 0
        for file, path in found.items():
            current = self._files.get(file)
            if current is None:
                if self.park_after is not None and not self._grew(path, file):
                    continue  # empty, or parked and not grown: nothing to read, no descriptor needed
                if len(self._files) >= self.max_files and (self.park_after is None or not self._park_idlest()):
                    skipped += 1
                    continue
                if out_of_descriptors:
                    out_of_descriptors += 1
                    continue
                try:
                    current = self._open(path, file, at_end=self.start_at_end and not self._swept)
                except OSError:  # EMFILE/ENFILE: no use trying the other files this sweep
                    out_of_descriptors = 1
                    continue
            if current is None:
                continue
            current.path = path
            current.quiet_orphan_sweeps = 0
            before = budget.bytes
            yield from self._read(current, budget)
            current.idle_sweeps = 0 if budget.bytes < before else current.idle_sweeps + 1
        self.skipped = skipped
        if skipped:
            problems.append(
                f"{len(found)} files match; following {self.max_files} at most (max_files), {skipped} left unread"
            )
        if out_of_descriptors:
            problems.append(f"out of file descriptors: {out_of_descriptors} files left unread")
        self._report(problems)
        self._swept = True

    def read_path(self, path: str) -> Iterator[Line]:
        """A file-system event names ``path``: read it now (it grew, appeared, or a new
        file took the place of one that was rotated away), one line at a time."""
        try:
            st = os.stat(path)
        except OSError:
            return  # gone: its descriptor is drained by the next sweep
        file = (st.st_dev, st.st_ino)
        budget = _Budget(self.read_budget, self.max_lines)
        followed = self._files.get(file)
        if followed is not None:
            followed.path = path
            yield from self._read(followed, budget)
            return
        if not self._swept or not stat.S_ISREG(st.st_mode) or not self.matches(path):
            return
        for other in list(self._files.values()):
            if other.path == path:  # the file that was here was rotated away: drain it first
                yield from self._read(other, budget)
        if len(self._files) >= self.max_files:
            return  # the cap holds for files an event names too; the next sweep counts it
        if file in self._parked and st.st_size <= self._parked[file]:
            return  # parked and not grown
        try:
            followed = self._open(path, file, at_end=False)
        except OSError:
            return  # out of descriptors: the next sweep reports it
        if followed is not None:
            yield from self._read(followed, budget)

    def close(self) -> None:
        for followed in list(self._files.values()):
            os.close(followed.fd)
        self._files.clear()
        self._parked.clear()

    def _grew(self, path: str, file: FileId) -> bool:
        """Whether a file not followed has something to read: bytes past where it was parked, or
        any, for one never followed (an empty file is opened once it has some, from its start)."""
        try:
            size = os.stat(path).st_size
        except OSError:
            return False
        if file in self._parked:
            if size < self._parked[file]:
                self._parked[file] = 0  # truncated meanwhile: read from its start
            return size > self._parked[file]
        return size > 0

    def _park_idlest(self) -> bool:
        """Close the followed file idle the longest (at least park_after sweeps, no partial line
        held), keeping its offset; False when none is idle enough."""
        idle = [
            f
            for f in self._files.values()
            if f.idle_sweeps >= (self.park_after or 0) and not f.discarding and f.context is None
        ]
        if not idle:
            return False
        followed = max(idle, key=lambda f: f.idle_sweeps)
        os.close(followed.fd)
        del self._files[followed.file]
        # A partial line is read again from its start when the file is read on.
        self._parked[followed.file] = followed.offset - len(followed.partial)
        while len(self._parked) > 16 * max(self.max_files, 1):
            del self._parked[next(iter(self._parked))]  # the longest parked: read from its start if it grows
        return True

    def why_no_files(self) -> str:
        """Why nothing is followed, in words for an operator (``lockstep doctor``), pattern by
        pattern: it matches nothing; it matches directories (holding no file named
        ``directory_files``, or, without it, which are not read) or other things that are
        not regular files; the files it matches cannot be opened (with the error); a
        directory on the way cannot be listed.  Looks again (globs, opens and closes): for
        a check, not for every round."""
        reasons = []
        for pattern in self.patterns:
            globbed = glob_files(pattern)
            reasons += [f"cannot list {error}" for error in globbed.errors]
            if not globbed.paths:
                if not globbed.errors:
                    reasons.append(f"nothing matches {pattern}")
                continue
            directories, files, others = _kinds(globbed.paths)
            if directories and self.directory_files is None:
                reasons.append(f"{pattern} matches only directories: {_some(directories, 'directory', 'directories')}")
            elif directories:
                assert self.directory_files is not None
                inner: list[str] = []
                for directory in directories:
                    globbed_inner = glob_files(os.path.join(glob.escape(directory), self.directory_files))
                    reasons += [f"cannot list {error}" for error in globbed_inner.errors]
                    inner += globbed_inner.paths
                if not inner:
                    reasons.append(
                        f"{pattern} matches directories holding no file named {self.directory_files}: "
                        f"{_some(directories, 'directory', 'directories')}"
                    )
                files += _kinds(inner)[1]
            if others:
                reasons.append(f"{pattern} matches what is not a regular file: {_some(others, 'path', 'paths')}")
            unreadable = [f"{path}: {error}" for path in files if (error := _open_error(path))]
            if unreadable:
                reasons.append(f"{pattern} matches files that cannot be opened: {_some(unreadable, 'file', 'files')}")
        return "; ".join(reasons) or "every matching file is followed"

    # --- internals ---

    def _stat(self, path: str, problems: list[str]) -> os.stat_result | None:
        """``path``'s status, or None: vanished between glob and stat (nothing to say), or out of
        descriptors or memory (added to ``problems``, ending with ``path``)."""
        try:
            return os.stat(path)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                problems.append(f"{path}: {os.strerror(exc.errno).lower()}")
            return None

    def _report(self, problems: list[str]) -> None:
        """Log what the sweep could not do, once per change (the same problem every round is
        not news), as an error: files left unread are data lost."""
        if problems != self.problems:
            if problems:
                shown = "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
                self.log.error("some log files cannot be followed: %s", shown)
            self.problems = problems

    def _open(self, path: str, file: FileId, at_end: bool) -> _Followed | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise  # the sweep reports it once, for all the files it leaves unread
            self.log.warning("cannot open log file", extra={"path": path, "error": str(exc)})
            return None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != file:  # replaced between stat and open: next sweep
            os.close(fd)
            return None
        followed = _Followed(fd=fd, file=file, path=path, offset=self._parked.pop(file, 0))
        if at_end and st.st_size > 0 and not followed.offset:  # (a parked file is read on from its offset)
            followed.offset = st.st_size
            tail = os.pread(fd, min(st.st_size, self.max_line_bytes + 1), max(0, st.st_size - self.max_line_bytes - 1))
            # Starting inside a line: drop its rest when it arrives.
            followed.discarding = not tail.endswith(b"\n")
            complete = tail[: max(0, tail.rfind(b"\n"))]
            start = complete.rfind(b"\n") + 1
            if complete.strip() and (start > 0 or len(tail) == st.st_size):
                followed.context = Line(file, path, complete[start:], context=True)
        if any(f.path == path for f in self._files.values()):
            self.rotations += 1
            self.log.info("log file rotated: following the new file from its start", extra={"path": path})
        self._files[file] = followed
        return followed

    def _close(self, followed: _Followed) -> Iterator[Line]:
        """Stop following; a last line without its newline is handed over as it is."""
        os.close(followed.fd)
        del self._files[followed.file]
        if followed.partial and not followed.discarding:
            yield Line(followed.file, followed.path, bytes(followed.partial))

    def _read(self, followed: _Followed, budget: _Budget) -> Iterator[Line]:
        """Hand over the complete lines appended since the last read, within the budget (and
        at most read_budget bytes of this file), one at a time.  The file's offset moves past
        each line before it is handed over, so a line is never read twice."""
        size = os.fstat(followed.fd).st_size
        if size < followed.offset:
            self.truncations += 1
            self.log.info("log file truncated, reading it from the start", extra={"path": followed.path})
            followed.offset = 0
            followed.partial.clear()
            followed.discarding = False
        if followed.context is not None:
            context, followed.context = followed.context, None
            yield context
        file_left = self.read_budget
        while budget.bytes > 0 and budget.lines > 0 and file_left > 0:
            chunk = os.pread(followed.fd, min(_CHUNK, budget.bytes, file_left), followed.offset)
            if not chunk:
                return
            base = followed.offset
            start = 0
            while start < len(chunk) and budget.lines > 0:
                newline = chunk.find(b"\n", start)
                end = len(chunk) if newline < 0 else newline
                if not followed.discarding:
                    if end - start + len(followed.partial) > self.max_line_bytes:
                        self.lines_too_long += 1
                        followed.partial.clear()
                        followed.discarding = True
                    elif newline < 0:
                        followed.partial += chunk[start:end]
                if newline < 0:
                    start = len(chunk)
                    break
                if followed.discarding:
                    followed.discarding = False  # the newline ends the dropped line
                    data = b""
                elif followed.partial:
                    followed.partial += chunk[start:end]
                    data = bytes(followed.partial)
                    followed.partial.clear()
                else:
                    data = chunk[start:end]
                start = newline + 1
                followed.offset = base + start
                if data.strip():
                    budget.lines -= 1
                    yield Line(followed.file, followed.path, data)
            followed.offset = base + start
            budget.bytes -= start
            file_left -= start
            if start < len(chunk):
                return  # the line budget is spent: the rest of the chunk is read next time
            del chunk  # before the next read: one chunk in memory at a time


class DirectoryWatcher:
    """Calls ``on_path(path)`` for every file-system event in the watched directories, and
    ``on_closed(path)`` too when a process closed a file it had open for writing
    (IN_CLOSE_WRITE: the kernel reports it to any watcher that may read the directory,
    whoever the process was, so an unprivileged agent learns that a writer exited or closed
    its log without seeing other users' processes).

    Wraps a watchdog observer (inotify on Linux).  ``watch(directories)`` replaces the
    set of watched directories (each non-recursively).  Raises OSError when the kernel
    refuses (e.g. the inotify watch limit); the caller then relies on polling.
    """

    def __init__(self, on_path: Callable[[str], None], on_closed: Callable[[str], None] | None = None) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.is_directory or event.event_type in ("opened", "closed_no_write"):
                    return
                on_path(os.fsdecode(event.src_path))
                if getattr(event, "dest_path", ""):
                    on_path(os.fsdecode(event.dest_path))
                if event.event_type == "closed" and on_closed is not None:
                    on_closed(os.fsdecode(event.src_path))

        self._handler = Handler()
        self._observer: Any = Observer()
        self._observer.daemon = True
        self._watches: dict[str, Any] = {}
        self._started = False

    def watch(self, directories: Iterable[str]) -> list[str]:
        """Watch these directories (and no others); returns the problems, in words."""
        wanted = set(directories)
        problems = []
        for directory in set(self._watches) - wanted:
            try:
                self._observer.unschedule(self._watches.pop(directory))
            except (KeyError, OSError):
                pass  # its watch ended with the directory
        for directory in sorted(wanted - set(self._watches)):
            try:
                self._watches[directory] = self._observer.schedule(self._handler, directory, recursive=False)
            except OSError as exc:  # vanished meanwhile, or the inotify watch limit
                problems.append(f"{directory}: {exc.strerror or exc}")
        if not self._started:
            self._observer.start()
            self._started = True
        return problems

    @property
    def directories(self) -> set[str]:
        return set(self._watches)

    def stop(self) -> None:
        if self._started:
            self._observer.stop()
            self._observer.join(timeout=5)


class GlobResult:
    """The regular-file paths a pattern matched, and what went wrong finding them."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.errors: list[str] = []  # e.g. "/logs/job=1: too many open files"
        self.truncated = False  # stopped at MAX_GLOB_DIRECTORIES


# A sweep lists at most this many directories per pattern: a ``**`` over a huge tree (or one
# that keeps growing) costs bounded time, and the rest is reported instead of walked.
MAX_GLOB_DIRECTORIES = 20_000


def glob_files(pattern: str, max_directories: int = MAX_GLOB_DIRECTORIES) -> GlobResult:
    """The files matching ``pattern`` with glob's rules (``**`` spans directories, hidden names
    only match patterns that start with a dot), except that ``**`` never descends through a
    symlink to a directory: Python's glob does, and a symlink loop under a ``**`` makes it
    run for ever.  Unlike glob, a directory that cannot be listed is reported, not skipped in
    silence: a sweep that missed files must not take them for deleted."""
    result = GlobResult()
    parts = _parts(pattern)
    seen: set[str] = set()
    listed = 0
    stack: list[tuple[str, int]] = [("/", 0)]
    while stack:
        base, index = stack.pop()
        if index == len(parts):
            if base not in seen:
                seen.add(base)
                result.paths.append(base)
            continue
        part = parts[index]
        if not glob.has_magic(part):
            candidate = os.path.join(base, part)
            if os.path.lexists(candidate):
                stack.append((candidate, index + 1))
            continue
        if listed >= max_directories:
            result.truncated = True
            break
        listed += 1
        try:
            with os.scandir(base) as entries:
                children = [(e.name, e.is_dir(follow_symlinks=False), e.is_dir()) for e in entries]
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            continue
        except OSError as exc:
            result.errors.append(f"{base}: {(exc.strerror or str(exc)).lower()}")
            continue
        if part == "**":
            stack.append((base, index + 1))  # zero directories
            for name, real_directory, _ in children:
                if real_directory and not name.startswith("."):
                    stack.append((os.path.join(base, name), index))
            if index + 1 == len(parts):  # a trailing ** also matches the files below
                stack.extend(
                    (os.path.join(base, name), index + 1)
                    for name, directory, _ in children
                    if not directory and not name.startswith(".")
                )
            continue
        for name, _, _ in children:
            if name.startswith(".") and not part.startswith("."):
                continue
            if fnmatch.fnmatchcase(name, part):
                stack.append((os.path.join(base, name), index + 1))
    result.paths.sort()
    return result


def _under(root: Path, pattern: str) -> str:
    """A host path pattern as seen from here, with the host's file system at ``root``."""
    if str(root) == "/":
        return os.path.normpath(pattern)
    return os.path.normpath(os.path.join(str(root), pattern.lstrip("/")))


def _kinds(paths: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """``paths`` sorted into (directories, regular files, anything else), symlinks followed;
    what vanished meanwhile is left out."""
    directories, files, others = [], [], []
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            directories.append(path)
        elif stat.S_ISREG(mode):
            files.append(path)
        else:
            others.append(path)
    return directories, files, others


def _open_error(path: str) -> str:
    """Why ``path`` cannot be opened for reading, as the follower opens it ("" when it can)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY))
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return ""


def _some(items: Sequence[str], one: str, many: str, shown: int = 3) -> str:
    """'2 directories (/a, /b)', at most ``shown`` of them named."""
    named = ", ".join(items[:shown]) + (", ..." if len(items) > shown else "")
    return f"{len(items)} {one if len(items) == 1 else many} ({named})"


def _parts(path: str) -> list[str]:
    return [p for p in os.path.normpath(path).split("/") if p]


def _match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """glob semantics per path component: ``*`` stays within one, ``**`` spans any
    number, and names starting with a dot only match patterns that do."""
    if not pattern:
        return not parts
    head = pattern[0]
    if head == "**":
        return any(_match(pattern[1:], parts[i:]) for i in range(len(parts) + 1) if not _hidden(parts[:i]))
    if not parts:
        return False
    name = parts[0]
    if name.startswith(".") and not head.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, head) and _match(pattern[1:], parts[1:])


def _hidden(parts: Sequence[str]) -> bool:
    return any(p.startswith(".") for p in parts)
