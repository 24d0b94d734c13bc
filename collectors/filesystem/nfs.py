"""NFS client statistics: the per-operation RPC counters of /proc/<pid>/mountstats."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lockstep.collectors.toolkit.mounts import unescape


@dataclass
class NfsOperation:
    operations: int
    transmissions: int
    major_timeouts: int
    sent_bytes: int
    received_bytes: int
    queue_ms: int
    rtt_ms: int
    execute_ms: int
    errors: int | None  # only in kernels 5.3+ (the 9th field)


def parse_mountstats(text: str) -> tuple[dict[str, dict[str, NfsOperation]], int]:
    """Per NFS mountpoint, per operation: the RPC counters; and the number of skipped lines.

    Only the parts read here are parsed: the ``device ... mounted on ... with fstype nfs*``
    header and the lines under ``per-op statistics``, which are
    ``OP: ops transmissions major_timeouts bytes_sent bytes_received queue_ms rtt_ms execute_ms [errors]``.
    Other mounts' headers (``device proc mounted on /proc with fstype proc``) have no statistics.
    """
    stats: dict[str, dict[str, NfsOperation]] = {}
    skipped = 0
    current: dict[str, NfsOperation] | None = None
    in_per_op = False
    header = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: (.*))?$")
    for line in text.splitlines():
        if line.startswith("device "):
            in_per_op = False
            match = header.match(line)
            if not match:
                current = None
                skipped += 1
                continue
            fstype = match.group(3)
            current = stats.setdefault(unescape(match.group(2)), {}) if fstype.startswith("nfs") else None
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped == "per-op statistics":
            in_per_op = True
            continue
        if not in_per_op or not stripped:
            continue
        name, colon, rest = stripped.partition(":")
        values = rest.split()
        if not colon or not name or len(values) not in (8, 9) or not all(v.isdigit() for v in values):
            skipped += 1
            continue
        n = [int(v) for v in values]
        current[name] = NfsOperation(n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8] if len(n) == 9 else None)
    return {mountpoint: ops for mountpoint, ops in stats.items() if ops}, skipped
