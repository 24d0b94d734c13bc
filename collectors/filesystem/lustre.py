"""Lustre client statistics: the llite ``stats`` file."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LustreStats:
    read_bytes: int = 0
    write_bytes: int = 0
    operations: dict[str, int] = field(default_factory=dict)


# Lines of a Lustre stats file that are times, not counters.
_LUSTRE_TIME_LINES = ("snapshot_time", "start_time", "elapsed_time")


def parse_lustre_stats(text: str) -> tuple[LustreStats, int]:
    """llite ``stats``: ``NAME COUNT samples [UNIT] [MIN MAX SUM [SUMSQ]]`` per line.

    ``read_bytes``/``write_bytes`` carry the byte sums; every counter line's COUNT is the
    number of operations of that type (read_bytes' count is the number of reads).
    """
    stats, skipped = LustreStats(), 0
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] in _LUSTRE_TIME_LINES:
            continue
        if len(fields) < 4 or fields[2] != "samples" or not fields[1].isdigit() or not fields[3].startswith("["):
            skipped += 1
            continue
        name, count = fields[0], int(fields[1])
        if name in ("read_bytes", "write_bytes"):
            if len(fields) < 7 or not fields[6].isdigit():
                skipped += 1
                continue
            if name == "read_bytes":
                stats.read_bytes = int(fields[6])
            else:
                stats.write_bytes = int(fields[6])
            name = name.removesuffix("_bytes")
        stats.operations[name] = count
    return stats, skipped
