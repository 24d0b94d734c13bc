"""Issue 35's hang scenarios and what each fires at the workload's own timing: the table of
tests/alerts/test_hangs_e2e.py (shared with test_alerts_e2e.py, which checks every demo scenario
is a case of some end-to-end run)."""

from __future__ import annotations

# alertname -> labels it must carry; nothing else of the hang alerts fires.
NODE = {"job_id": "4242", "gpu": "6"}
HANG_CASES: dict[str, dict[str, dict[str, str]]] = {
    "hang-steps": {"LockstepTrainingHung": NODE},
    "hang-nccl": {"LockstepNCCLRankStuck": {**NODE, "rank": "6"}},
    "hang-killed": {
        "LockstepNCCLRankStuck": {**NODE, "rank": "6"},
        "LockstepJobEndedHung": {**NODE, "rank": "6", "hang_alert": "LockstepNCCLRankStuck"},
    },
    "hang-save": {},
    "hang-eval": {},
    "hang-end": {},
}
