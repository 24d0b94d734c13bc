"""gres.conf: which GPU device files a GRES index stands for, and Slurm's range and bracket notation."""

from __future__ import annotations

import re


def expand_ranges(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
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
