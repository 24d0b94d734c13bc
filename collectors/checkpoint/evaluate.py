"""Evaluating what a scan saw: which saves are complete, which one is in progress, and
when each started and ended."""

from __future__ import annotations

from lockstep.collectors.checkpoint.config import RESYNC_SECONDS
from lockstep.collectors.checkpoint.state import Observation, RootState, Save


def _save_start(state: RootState, obs: Observation) -> float:
    """The earliest trace of the save, kept across scans (a NeMo marker is gone by the end)."""
    with state.lock:
        candidates = [state.first_seen.get(obs.name, float("inf"))]
        if obs.marker_mtime is not None:
            candidates.append(obs.marker_mtime)
        if obs.walk.oldest_mtime is not None:
            candidates.append(obs.walk.oldest_mtime)
        elif obs.walk.files == 0:
            candidates.append(obs.walk.own_mtime)  # an empty directory: made when the save began
        state.first_seen[obs.name] = start = min(candidates)
    return start


def _save_end(state: RootState, obs: Observation) -> float:
    if obs.completed_at is not None:
        return obs.completed_at
    newest = obs.walk.newest_mtime if obs.walk.newest_mtime is not None else obs.walk.own_mtime
    if obs.kind == "generic" and obs.name in state.renamed:
        return max(newest, obs.walk.own_ctime)  # renamed from its temporary name: renaming sets ctime
    return newest


def _is_complete(state: RootState, obs: Observation, now: float) -> bool:
    if obs.kind in ("dcp", "megatron", "nemo"):
        return obs.complete_by_marker
    if obs.temp or obs.walk.files == 0:
        return False  # still under its temporary name, or nothing written yet
    if obs.name in state.renamed:
        return True  # appeared by an atomic rename from a temporary name
    return now - _save_end(state, obs) >= state.spec.quiet_period


def evaluate(state: RootState, now: float) -> None:
    """Which saves are complete, which one is in progress, and count completions."""
    baseline = state.names_at_first_listing or set()
    in_progress: list[tuple[float, Observation]] = []
    for name, obs in state.observations.items():
        start = _save_start(state, obs)
        if not _is_complete(state, obs, now):
            state.completed.pop(name, None)
            in_progress.append((start, obs))
            continue
        save = Save(name, obs.kind, start, max(_save_end(state, obs), start), obs.walk.size)
        previous = state.completed.get(name)
        if previous is not None and previous.end == save.end:
            continue
        state.completed[name] = save
        # Saves already complete when the agent first listed the root are history, not new saves.
        if name in state.seen_in_progress or name not in baseline:
            state.saves_total += 1
        if state.last is None or save.end >= state.last.end:
            state.last = save
    # Forget what is gone from the root (retention deleted it).
    listed = state.observations.keys()
    state.completed = {n: save for n, save in state.completed.items() if n in listed}
    state.seen_in_progress &= listed
    state.renamed &= listed
    with state.lock:
        for name in [n for n in state.first_seen if n not in state.observations]:
            # An inotify event may run ahead of the scan that lists the save: keep it a while.
            if now - state.first_seen[name] > RESYNC_SECONDS:
                del state.first_seen[name]
    # An incomplete save older than the newest completed one is a crashed job's leftover.
    newest_complete_start = max((s.start for s in state.completed.values()), default=float("-inf"))
    current = [(start, obs) for start, obs in in_progress if start > newest_complete_start]
    for _start, obs in current:
        state.seen_in_progress.add(obs.name)
    state.current_start, state.current = max(current, key=lambda pair: pair[0], default=(None, None))
