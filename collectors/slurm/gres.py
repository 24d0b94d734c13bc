"""gres.conf: which GPU device files a GRES index stands for, and Slurm's range and bracket notation."""

from __future__ import annotations

import re

# The most GRES indices one job's list may name.  A node holds at most a few hundred GPUs; the
# list comes from a job's environment (SLURM_JOB_GPUS), which its user can set to anything, and
# "0-30000000" expanded held 1.2 GB for the job's life.
MAX_GRES_INDICES = 4096
_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")  # ASCII digits only; 9 digits is past any index


def expand_ranges(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5].

    ValueError for what Slurm never writes: a part that is not N or N-M with N <= M (``-``,
    ``3-1``, ``a``), or a list naming more than MAX_GRES_INDICES indices."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"GPU index list {text[:64]!r}: {part[:64]!r} is not N or N-M")
        first = int(match.group(1))
        last = int(match.group(2) or first)
        if last < first:
            raise ValueError(f"GPU index list {text[:64]!r}: range {part[:64]!r} runs backwards")
        if len(out) + (last - first + 1) > MAX_GRES_INDICES:
            raise ValueError(f"GPU index list {text[:64]!r} names more than {MAX_GRES_INDICES} indices")
        out.extend(range(first, last + 1))
    return out


def expand_brackets(text: str) -> list[str]:
    """Slurm's '/dev/nvidia[0-1,3]' -> ['/dev/nvidia0', '/dev/nvidia1', '/dev/nvidia3']."""
    match = re.search(r"\[([^\]]+)\]", text)
    if not match:
        return [text]
    head, tail = text[: match.start()], text[match.end() :]
    out = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        width = len(low)
        for n in range(int(low), int(high or low) + 1):
            out.extend(expand_brackets(f"{head}{n:0{width}d}{tail}"))
    return out


def parse_gres_conf(text: str, node: str) -> list[str]:
    """gres.conf's GPU device files for this node, in the order that defines GRES indices."""
    files: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        fields = {k.lower(): v for k, v in fields.items()}
        if fields.get("name") != "gpu" or "file" not in fields:
            continue
        names = fields.get("nodename")
        if names is not None and node not in expand_brackets(names) and names != node:
            continue
        files.extend(expand_brackets(fields["file"]))
    return files
