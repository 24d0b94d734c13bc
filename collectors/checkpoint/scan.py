"""Scanning a root: list it, recognise each save's format and walk the saves (those not
already known complete), within max_files."""

from __future__ import annotations

import os

from lockstep.agent.files import read_text
from lockstep.collectors.checkpoint.markers import (
    MEGATRON_ITERATION,
    MEGATRON_TRACKER,
    NEMO_MARKER_SUFFIX,
    NEMO_MEMBER_SUFFIXES,
    NOT_SAVES,
    final_name,
)
from lockstep.collectors.checkpoint.state import Observation, RootState
from lockstep.collectors.checkpoint.walk import Budget, Walk, walk


def scan(state: RootState, now: float, max_files: int) -> dict[str, Observation]:
    """List the root and walk its saves (those not already known complete), within max_files."""
    budget = Budget(max_files)
    entries: dict[str, os.DirEntry[str]] = {}
    with os.scandir(state.path) as listing:
        for entry in listing:
            if not budget.take():
                break
            entries[entry.name] = entry
    if state.names_at_first_listing is None:
        state.names_at_first_listing = {final_name(n)[0] for n in entries}
    megatron = MEGATRON_TRACKER in entries or any(MEGATRON_ITERATION.match(n) for n in entries)
    observations: dict[str, Observation] = {}
    # Newest first, so a capped scan spends its budget on the saves that matter.
    ordered = sorted(entries.values(), key=_mtime_or_zero, reverse=True)
    if megatron:
        tracker = _read_tracker(state.path)
        for entry in ordered:
            match = MEGATRON_ITERATION.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                obs = _observe(state, entry.name, "megatron", entry.path, budget, now)
                if obs is not None and tracker is not None and int(match.group(1)) <= tracker[0]:
                    obs.complete_by_marker = True
                    # The tracker's mtime is this save's end only if it names this save.
                    obs.completed_at = tracker[1] if int(match.group(1)) == tracker[0] else None
                if obs is not None:
                    observations[entry.name] = obs
    else:
        markers = {n[: -len(NEMO_MARKER_SUFFIX)]: e for n, e in entries.items() if n.endswith(NEMO_MARKER_SUFFIX)}
        state.nemo_names |= set(markers)
        members = {name + suffix: name for name in state.nemo_names for suffix in NEMO_MEMBER_SUFFIXES}
        nemo_paths: dict[str, list[str]] = {}
        for entry in ordered:
            if entry.name in NOT_SAVES or entry.name.endswith(NEMO_MARKER_SUFFIX):
                continue
            if entry.name in members:
                nemo_paths.setdefault(members[entry.name], []).append(entry.path)
                continue
            name, temp = final_name(entry.name)
            if entry.name.startswith(".") and not temp:
                continue  # hidden files (.nfs silly-renames, editors' files) are not saves
            if temp:
                state.renamed.add(name)
            obs = _observe(state, name, "generic", entry.path, budget, now)
            if obs is None:
                continue
            obs.temp = temp
            if obs.walk.metadata_mtime is not None or obs.walk.has_shards:
                obs.kind = "dcp"
                obs.completed_at = obs.walk.metadata_mtime
                obs.complete_by_marker = obs.walk.metadata_mtime is not None
            observations[name] = obs
        for name in state.nemo_names:
            marker = markers.get(name)
            obs = _observe_nemo(state, name, nemo_paths.get(name, []), marker, budget, now)
            if obs is not None:
                observations[name] = obs
        # Forget NeMo saves that are gone altogether.
        state.nemo_names = {n for n in state.nemo_names if n in markers or n in nemo_paths}
    state.truncated = budget.exhausted
    return observations


def _observe(state: RootState, name: str, kind: str, path: str, budget: Budget, now: float) -> Observation | None:
    state.note(name, now)
    known = state.completed.get(name)
    if known is not None:
        # Already complete: re-walking it every run would cost a stat per file. Its
        # directory's mtime changes when files are added or removed (a save rewritten).
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        previous = state.observations.get(name)
        if previous is not None and previous.walk.own_mtime == st.st_mtime:
            return previous
    try:
        return Observation(name, kind, walk(path, budget))
    except OSError:
        return None  # removed between listing and walking


def _observe_nemo(
    state: RootState,
    name: str,
    paths: list[str],
    marker: os.DirEntry[str] | None,
    budget: Budget,
    now: float,
) -> Observation | None:
    previous = state.observations.get(name)
    if marker is None and name in state.completed and previous is not None:
        return previous  # complete and not being rewritten (no new marker): no need to walk it again
    combined = Walk()
    for path in paths:
        try:
            part = walk(path, budget)
        except OSError:
            continue
        combined.files += part.files
        combined.size += part.size
        combined.truncated |= part.truncated
        if part.oldest_mtime is not None:
            old = combined.oldest_mtime
            combined.oldest_mtime = part.oldest_mtime if old is None else min(old, part.oldest_mtime)
        if part.newest_mtime is not None:
            new = combined.newest_mtime
            combined.newest_mtime = part.newest_mtime if new is None else max(new, part.newest_mtime)
        combined.own_mtime = max(combined.own_mtime, part.own_mtime)
    obs = Observation(name, "nemo", combined)
    if marker is not None:
        try:
            obs.marker_mtime = marker.stat(follow_symlinks=False).st_mtime
        except OSError:
            marker = None
    if marker is None:
        if not paths:
            return None
        obs.complete_by_marker = True
    state.note(name, now)
    return obs


def _mtime_or_zero(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _read_tracker(root: str) -> tuple[int, float] | None:
    """Megatron's latest_checkpointed_iteration.txt: (iteration, mtime); None if absent or 'release'."""
    path = os.path.join(root, MEGATRON_TRACKER)
    try:
        text = read_text(path).strip()
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    return (int(text), mtime) if text.isdigit() else None
