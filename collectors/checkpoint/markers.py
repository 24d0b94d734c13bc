"""How the common checkpoint writers name a save's files: the markers of its start and end
(PyTorch DCP, NeMo, Megatron) and the temporary names a save is renamed from."""

from __future__ import annotations

import re

DCP_METADATA = ".metadata"
DCP_SHARD_SUFFIX = ".distcp"
NEMO_MARKER_SUFFIX = "-unfinished"
NEMO_MEMBER_SUFFIXES = ("", ".ckpt", ".nemo")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON_ITERATION = re.compile(r"^iter_(\d+)$")
# Pointer files next to saves, not saves (DeepSpeed's "latest", Megatron's tracker).
NOT_SAVES = frozenset({"latest", MEGATRON_TRACKER})
TEMP_PREFIXES = ("tmp-", "tmp_", "tmp.")
TEMP_SUFFIXES = (".tmp", ".temp", ".partial", ".incomplete", ".inprogress")


def final_name(name: str) -> tuple[str, bool]:
    """(the name the save will have, whether ``name`` is a temporary one).

    ``tmp-checkpoint-500`` (Hugging Face Trainer) -> ``checkpoint-500``; ``.model.pt.tmp`` -> ``model.pt``.
    """
    base = name[1:] if name.startswith(".") else name
    for prefix in TEMP_PREFIXES:
        if base.startswith(prefix) and len(base) > len(prefix):
            return base[len(prefix) :], True
    for suffix in TEMP_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[: -len(suffix)], True
    return name, False
