"""The checkpoint collector's settings: the roots (patterns with their expected interval, watch
mode and quiet period), the scan's limit and the job-id pattern."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lockstep.agent.options import option, parse_choice, parse_duration, parse_positive_int, parse_string
from lockstep.collectors.checkpoint.watch import MAX_WATCH_DEPTH

WATCH_MODES = ("auto", "inotify", "poll")
DEFAULT_QUIET_PERIOD = 60.0
DEFAULT_MAX_FILES = 100_000
# A root watched with inotify is rescanned this often even without events (lost events, overflow).
RESYNC_SECONDS = 300.0
DEFAULT_JOB_ID_PATTERN = r"(?<![A-Za-z0-9])(?:slurm[-_]?)?job(?:_?id)?[=_-]?(\d+)(?!\d)"


@dataclass(frozen=True)
class RootSpec:
    pattern: str  # a host path glob, e.g. /lustre/ckpt/*
    expected_interval: float | None = None
    watch: str = "auto"
    quiet_period: float = DEFAULT_QUIET_PERIOD


_ROOT_KEYS = ("path", "expected_interval", "watch", "quiet_period")


def parse_roots(value: Any) -> tuple[RootSpec, ...]:
    """A list of roots: each a path pattern, or a mapping with ``path`` and optional
    ``expected_interval``, ``watch`` (auto|inotify|poll) and ``quiet_period``."""
    if value is None or value == ():
        return ()
    items = value if isinstance(value, (list, tuple)) else [value]
    roots = []
    for i, item in enumerate(items):
        where = f"root {i + 1}"
        if isinstance(item, str):
            item = {"path": item}
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a path or a mapping with 'path', got {item!r}")
        unknown = [k for k in item if k not in _ROOT_KEYS]
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_ROOT_KEYS)})")
        if "path" not in item:
            raise ValueError(f"{where}: 'path' is required")
        try:
            path = parse_string(item["path"])
            if not path.startswith("/"):
                raise ValueError(f"expected an absolute path, got {path!r}")
            interval = item.get("expected_interval")
            roots.append(
                RootSpec(
                    pattern=path,
                    expected_interval=parse_duration(interval) if interval is not None else None,
                    watch=parse_choice(WATCH_MODES)(item.get("watch", "auto")),
                    quiet_period=parse_duration(item.get("quiet_period", DEFAULT_QUIET_PERIOD)),
                )
            )
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tuple(roots)


def parse_regex_with_group(value: Any) -> str:
    text = parse_string(value)
    try:
        compiled = re.compile(text)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    if compiled.groups < 1:
        raise ValueError("the pattern needs one (group) capturing the job id")
    return text


@dataclass(frozen=True)
class CheckpointOptions:
    roots: tuple[RootSpec, ...] = option(
        (),
        parse_roots,
        "checkpoint root patterns (host paths; mappings add expected_interval, watch, quiet_period)",
        flag="--checkpoint.root",
        repeatable=True,
    )
    max_files: int = option(DEFAULT_MAX_FILES, parse_positive_int, "files a scan of one root stats at most")
    max_watch_depth: int = option(
        MAX_WATCH_DEPTH,
        parse_positive_int,
        "directory levels below a root watched with inotify; deeper directories are counted, not watched",
    )
    job_id_pattern: str = option(
        DEFAULT_JOB_ID_PATTERN,
        parse_regex_with_group,
        "regular expression whose group captures the Slurm job id in a root's path",
    )
