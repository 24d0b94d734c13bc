"""What the checkpoint collector knows: a save as the latest scan saw it, a completed save,
and each root's state across runs."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from lockstep.collectors.checkpoint.config import RootSpec
from lockstep.collectors.checkpoint.walk import Walk


@dataclass
class Observation:
    """One save as the latest scan saw it."""

    name: str
    kind: str  # dcp | nemo | megatron | generic
    walk: Walk
    temp: bool = False  # generic, still under its temporary name
    marker_mtime: float | None = None  # NeMo: the -unfinished marker (the save's start)
    completed_at: float | None = None  # the completion marker's mtime, when there is one
    complete_by_marker: bool = False  # DCP/Megatron/NeMo said it is done


@dataclass(frozen=True)
class Save:
    name: str
    kind: str
    start: float
    end: float
    size: int


@dataclass
class RootState:
    """What the collector knows about one root across runs."""

    label: str  # the host path, as reported
    path: str  # where this agent reaches it
    spec: RootSpec
    mode: str = "poll"  # how it should be watched: inotify | poll
    storage: str = ""  # where it is: "local" (this node's own), "shared" (a network filesystem), "" unknown
    lock: threading.Lock = field(default_factory=threading.Lock)
    first_seen: dict[str, float] = field(default_factory=dict)  # save name -> first trace (clock)
    dirty: bool = True  # inotify: events since the last scan
    last_scan: float | None = None
    observations: dict[str, Observation] = field(default_factory=dict)
    names_at_first_listing: set[str] | None = None
    seen_in_progress: set[str] = field(default_factory=set)
    nemo_names: set[str] = field(default_factory=set)  # saves seen with a NeMo marker
    renamed: set[str] = field(default_factory=set)  # generic saves seen under a temporary name
    completed: dict[str, Save] = field(default_factory=dict)  # name -> the save as it completed
    saves_total: int = 0
    last: Save | None = None
    readable: bool = True
    error: str = ""
    truncated: bool = False
    current: Observation | None = None  # the save in progress now, if any
    current_start: float | None = None
    watch_handle: Any = None  # the inotify watch while there is one
    watched_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the directory the watch is on
    tracker_error: str = ""  # why the last scan skipped Megatron's tracker file ("" if it did not)
    tracker_error_logged: str = ""

    @property
    def watch(self) -> str:
        """How it is watched right now: inotify only while a watch is in place."""
        return "inotify" if self.watch_handle is not None else "poll"

    def note(self, name: str, when: float) -> None:
        """A trace of save ``name`` seen at ``when`` (from a scan or an inotify event)."""
        with self.lock:
            self.first_seen.setdefault(name, when)
