"""The simulated node's checkpoint saves (simulation/storage.py) as the scenarios tell them."""

from __future__ import annotations

from pathlib import Path

from lockstep.simulation.storage import EPOCH, checkpoints


def saves(root: Path) -> dict[str, bool]:
    """Each save directory, and whether it completed (its .metadata written last)."""
    return {d.name: (d / ".metadata").exists() for d in sorted(root.iterdir())}


def test_a_hung_nccl_job_begins_no_save_and_a_healthy_one_saves_on(tmp_path: Path) -> None:
    # t = 120: the regular save that began at t = 100 is writing its shards.
    checkpoints(tmp_path / "healthy", "healthy", EPOCH + 120)
    checkpoints(tmp_path / "hung", "nccl-hang", EPOCH + 120)
    healthy, hung = saves(tmp_path / "healthy"), saves(tmp_path / "hung")
    # (Besides hang-save's long save, which every other scenario saves at t = 60: storage._saves.)
    in_progress = [name for name, complete in healthy.items() if not complete and name != "step_999000"]
    assert len(in_progress) == 1
    # The hung job's saves are those that completed before its rank died (t = -120), no more.
    assert in_progress[0] not in hung and all(hung.values())
    assert set(hung) == {name for name, complete in healthy.items() if complete}
