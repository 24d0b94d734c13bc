"""Reading the small files of sysfs and procfs, fast.

``os.open``/``os.read`` cost half of ``open(path).read()`` on such files (measured on these
machines: 1.5 ms vs 3.1 ms for 432 files), and collectors read hundreds per round.
"""

from __future__ import annotations

import os
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
