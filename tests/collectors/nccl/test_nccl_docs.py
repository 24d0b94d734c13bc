"""docs/workloads.md says what NCCL's Inspector plugin really writes (issue 35, item 3), as read
in NVIDIA/nccl's source (v2.28.3-1 ext-profiler/inspector/inspector.cc, v2.30.7-1
plugins/profiler/inspector/inspector.cc: no dump thread with the default interval, and
inspectorDelComm drops what a destroyed communicator had not dumped) and seen running it."""

from __future__ import annotations

import re

from tests.support import REPO


def nccl_section() -> str:
    text = (REPO / "docs" / "workloads.md").read_text()
    start = text.index("## NCCL's own telemetry")
    return " ".join(text[start : text.index("\n## ", start + 1)].split())


def test_the_docs_promise_no_dump_at_teardown_and_say_what_is_lost() -> None:
    section = nccl_section()
    assert not re.search(r"writes? only at (communicator )?teardown", section)
    assert "nothing is written, not even at teardown" in section
    assert "**The last interval is never written**" in section


def test_the_docs_say_which_counts_are_exact_sampled_or_dropped_by_version() -> None:
    section = nccl_section()
    assert "exact up to the latest line" in section and "are **estimated**" in section
    assert 'records="sampled"' in section and 'records="all"' in section
    assert "but 2.30.7 drops most of them" in section
