"""Reading files the agent does not control, fast and within bounds.

``os.open``/``os.read`` cost half of ``open(path).read()`` on such files (measured on these
machines: 1.5 ms vs 3.1 ms for 432 files), and collectors read hundreds per round.

Files that users or workloads can write (a training job's tracker file, the config) may be a
FIFO (an open blocks until a writer comes), a symlink to ``/dev/zero`` (endless) or simply huge:
``read_regular_file`` opens without blocking, refuses anything but a regular file, and reads at
most a given size.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_text(path: Path | str) -> str:
    """The whole file as text (undecodable bytes replaced); OSError as the kernel gives it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


class FileTooLarge(OSError):
    """The file holds more than the reader accepts (errno EFBIG)."""


class NotRegularFile(OSError):
    """The path is a FIFO, device, socket or directory, which the reader refuses (errno EINVAL)."""


def read_regular_file(path: Path | str, limit: int) -> bytes:
    """The content of a regular file of at most ``limit`` bytes.

    Raises NotRegularFile for anything else (never blocking on a FIFO), FileTooLarge past the
    limit (having read no more than limit + 1 bytes), and OSError as the kernel gives it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else ("a directory" if stat.S_ISDIR(mode) else "not a regular file")
            )
            raise NotRegularFile(errno.EINVAL, f"is {kind}, not a regular file", str(path))
        chunks = []
        size = 0
        while size <= limit and (chunk := os.read(fd, min(65536, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileTooLarge(errno.EFBIG, f"holds more than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)
