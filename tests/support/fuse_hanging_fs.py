"""A FUSE filesystem whose statfs blocks on command: the hung NFS/Lustre/FUSE mount, for real.

Run as ``python tests/support/fuse_hanging_fs.py MOUNTPOINT`` (root, /dev/fuse, libfuse3 + mfusepy).
Commands on stdin, one per line: ``hang`` makes every later statfs block until ``release``.
It prints ``ready`` once mounted.  Unmount it with ``fusermount3 -u -z MOUNTPOINT``.
"""

from __future__ import annotations

import errno
import stat
import sys
import threading

import mfusepy as fuse


class HangingFilesystem(fuse.Operations):
    use_ns = True  # mfusepy: times in nanoseconds (the non-deprecated interface)

    def __init__(self) -> None:
        self.hanging = False
        self.released = threading.Event()

    def init(self, path: str) -> None:
        print("ready", flush=True)

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        raise fuse.FuseOSError(errno.ENOENT)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", ".."]

    def statfs(self, path: str) -> dict[str, int]:
        if self.hanging:
            self.released.wait()
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": 262144,  # 1 GiB
            "f_bfree": 196608,
            "f_bavail": 131072,
            "f_files": 1000,
            "f_ffree": 900,
            "f_namemax": 255,
        }


def main() -> None:
    filesystem = HangingFilesystem()

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "hang":
                filesystem.released.clear()
                filesystem.hanging = True
            elif line.strip() == "release":
                filesystem.hanging = False
                filesystem.released.set()

    threading.Thread(target=commands, daemon=True).start()
    fuse.FUSE(filesystem, sys.argv[1], foreground=True, fsname="hangfs", subtype="hangfs")


if __name__ == "__main__":
    main()
