"""Watching checkpoint roots with inotify, recursively down to a bounded depth.

Why not watchdog's recursive watch: it walks every new directory tree with ``os.walk``, which is
recursive up to Python 3.11, so a directory 1,000 levels deep under a root (any user who can
write there can make one) raised RecursionError: in the collector when the watch started (the
collector failed every round, for every root) and in watchdog's one inotify thread when the tree
appeared later (every inotify watch of the agent stopped, in silence).  Here the walk is a loop
and stops ``max_depth`` levels below the root: the subdirectories of a directory at that depth
are not watched, and such directories are counted (``cut``): a save's files are a level or two
below the root, and the periodic rescan (every RESYNC_SECONDS) still sees anything deeper.

One thread reads every root's inotify instance (one instance, so one descriptor, per root);
the collector's ``on_event(path)`` runs in that thread.  The kernel interface is inotify(7):
``inotify_init1``, ``inotify_add_watch`` and ``inotify_rm_watch`` from the C library, and events
read as ``struct inotify_event`` (int wd; uint32 mask, cookie, len; char name[len]).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import queue
import selectors
import struct
import threading
from collections.abc import Callable

# Directory levels below a root that are watched: the root is level 0, a save directory level 1,
# its files' directories 2 or 3 (Megatron's iter_N/mp_rank_XX/).  16 is far below Python's
# recursion limit and far above any checkpoint layout.
MAX_WATCH_DEPTH = 16

# From <sys/inotify.h> (Linux, every architecture).
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000
# Creations, deletions, renames and closes after writing: one event per file written, not one
# per write() (IN_MODIFY would flood the thread during a save).
_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")

log = logging.getLogger(__name__)


def _libc() -> ctypes.CDLL:
    # The running process's own symbols, libc's among them: find_library("c") would run
    # `ldconfig -p` (a child process) every time a watch starts.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


class TreeWatch:
    """One root's inotify instance and its watches (wd -> (path, depth))."""

    def __init__(self, libc: ctypes.CDLL, root: str, on_event: Callable[[str], None], max_depth: int) -> None:
        self._libc = libc
        self.root = root.rstrip("/") or "/"
        self.on_event = on_event
        self.max_depth = max_depth
        self._dirs: dict[int, tuple[str, int]] = {}
        # Watched directories max_depth levels down that have subdirectories (not watched).
        self._cut: set[int] = set()
        fd = libc.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self.fd = fd
        try:
            self._add_tree(self.root, 0, -1)
        except OSError:
            os.close(fd)
            raise

    @property
    def cut(self) -> int:
        """Directories max_depth levels below the root whose subdirectories are not watched."""
        return len(self._cut)

    def _add(self, path: str, depth: int) -> int:
        # The root may be a symlink (/ckpt -> /lustre/ckpt); below it, a directory replaced by a
        # symlink meanwhile is not followed.
        flags = _MASK | IN_ONLYDIR | (IN_DONT_FOLLOW if depth > 0 else 0)
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), flags)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        self._dirs[wd] = (path, depth)
        return int(wd)

    def _add_tree(self, top: str, depth: int, parent: int) -> None:
        """Watch ``top`` (at ``depth`` below the root, in the directory watched as ``parent``) and
        the directories under it, a loop (no recursion) that stops at max_depth.  Only a failure
        to watch the root itself raises."""
        stack = [(top, depth, parent)]
        while stack:
            path, level, parent = stack.pop()
            if level > self.max_depth:
                self._cut.add(parent)  # nothing under it is walked: a deep tree costs nothing
                continue
            try:
                wd = self._add(path, level)
                with os.scandir(path) as entries:
                    children = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
            except OSError as exc:
                if path == self.root:
                    raise
                if exc.errno == errno.ENOSPC:  # the user's inotify watch limit: the rescan covers the rest
                    log.warning("cannot watch %s: %s (fs.inotify.max_user_watches)", path, exc.strerror)
                    return
                continue  # removed meanwhile, or not readable
            stack.extend((child, level + 1, wd) for child in children)

    def _forget_tree(self, top: str) -> None:
        """A directory moved away: stop watching it and everything under it."""
        prefix = top + "/"
        for wd, (path, _) in list(self._dirs.items()):
            if path == top or path.startswith(prefix):
                self._libc.inotify_rm_watch(self.fd, wd)
                del self._dirs[wd]
                self._cut.discard(wd)

    def _recheck_cut(self, wd: int, directory: str) -> None:
        """A subdirectory left a directory at max_depth: is any left?"""
        try:
            with os.scandir(directory) as entries:
                if any(e.is_dir(follow_symlinks=False) for e in entries):
                    return
        except OSError:
            pass
        self._cut.discard(wd)

    def read(self) -> None:
        """Read and handle the pending events (from the watcher's thread)."""
        try:
            data = os.read(self.fd, 64 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw_name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                self.on_event(self.root)  # events were lost: the collector rescans the root
                continue
            if mask & IN_IGNORED:
                self._dirs.pop(wd, None)  # the directory is gone, or its watch was removed
                self._cut.discard(wd)
                continue
            watched = self._dirs.get(wd)
            if watched is None:
                continue
            directory, depth = watched
            path = os.path.join(directory, os.fsdecode(raw_name)) if raw_name else directory
            if mask & IN_ISDIR and mask & IN_MOVED_FROM:
                self._forget_tree(path)
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                self._add_tree(path, depth + 1, wd)
            if mask & IN_ISDIR and mask & (IN_DELETE | IN_MOVED_FROM) and wd in self._cut:
                self._recheck_cut(wd, directory)
            self.on_event(path)

    def close(self) -> None:
        os.close(self.fd)  # the kernel removes every watch of the instance


class TreeWatcher:
    """Every watched root, read by one thread.  ``watch`` starts a root's watch in the caller's
    thread (raising OSError if the root itself cannot be watched); the thread takes it from
    there.  Only the thread touches a root's watch afterwards, so nothing needs a lock."""

    def __init__(self, max_depth: int = MAX_WATCH_DEPTH) -> None:
        self.max_depth = max_depth
        self._libc = _libc()
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        self._requests: queue.SimpleQueue[tuple[str, TreeWatch]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-inotify", daemon=True)
        self._thread.start()

    def watch(self, root: str, on_event: Callable[[str], None]) -> TreeWatch:
        if self._stop.is_set():
            raise OSError(errno.ESHUTDOWN, "the watcher is closed", root)
        tree = TreeWatch(self._libc, root, on_event, self.max_depth)
        self._request("add", tree)
        return tree

    def unwatch(self, tree: TreeWatch) -> None:
        self._request("remove", tree)

    def close(self) -> None:
        self._stop.set()
        self._wake()
        self._thread.join(timeout=5)

    def _request(self, what: str, tree: TreeWatch) -> None:
        self._requests.put((what, tree))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_writer, b"x")
        except (BlockingIOError, OSError):
            pass  # already awake (pipe full) or closed

    def _run(self) -> None:
        trees: dict[int, TreeWatch] = {}
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=1.0):
                    tree = key.data
                    if tree is None:
                        self._take_requests(trees)
                        continue
                    try:
                        tree.read()
                    except Exception:  # one root's trouble never stops the others' watches
                        log.exception("reading inotify events of %s failed", tree.root)
        finally:
            self._take_requests(trees)
            for tree in trees.values():
                tree.close()
            self._selector.close()
            os.close(self._wake_reader)
            os.close(self._wake_writer)

    def _take_requests(self, trees: dict[int, TreeWatch]) -> None:
        try:
            while os.read(self._wake_reader, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                what, tree = self._requests.get_nowait()
            except queue.Empty:
                return
            if what == "add" and not self._stop.is_set():
                trees[tree.fd] = tree
                self._selector.register(tree.fd, selectors.EVENT_READ, tree)
            elif what == "add":
                tree.close()
            elif trees.pop(tree.fd, None) is tree:
                self._selector.unregister(tree.fd)
                tree.close()
