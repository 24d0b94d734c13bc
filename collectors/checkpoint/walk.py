"""Walking one save: its files' count, size and mtimes, within a budget of stats."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from lockstep.collectors.checkpoint.markers import DCP_METADATA, DCP_SHARD_SUFFIX


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
