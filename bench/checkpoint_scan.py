"""How long the checkpoint collector's runs take on a root with very many files.

    .venv/bin/python bench/checkpoint_scan.py [--saves 20] [--shards 10000] [--max-files 100000]

Makes a root of --saves DCP saves with --shards empty shard files each (in a temporary
directory), then times collector runs in polling mode: the first runs (capped at
--max-files per run, working through the history newest first) and the steady state
(completed saves are remembered: only their directory is stat'ed).  Prints the figures;
no assertion (the machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lockstep.agent.collector import CollectorContext, Paths  # noqa: E402
from lockstep.collectors.checkpoint import CheckpointCollector, CheckpointOptions  # noqa: E402
from lockstep.collectors.checkpoint.config import parse_roots  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--max-files", type=int, default=100_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lockstep-bench-ckpt-") as tmp:
        root = Path(tmp) / "ckpt"
        started = time.monotonic()
        for save in range(args.saves):
            directory = root / f"step_{save:06d}"
            directory.mkdir(parents=True)
            for shard in range(args.shards):
                os.close(os.open(directory / f"__{shard}_0.distcp", os.O_CREAT | os.O_WRONLY, 0o644))
            (directory / ".metadata").write_bytes(b"m")
        files = args.saves * (args.shards + 1)
        print(f"made {files} files in {args.saves} saves in {time.monotonic() - started:.1f}s")

        context = CollectorContext(
            paths=Paths(rootfs=Path(tmp)),
            options=CheckpointOptions(
                roots=parse_roots([{"path": "/ckpt", "watch": "poll"}]), max_files=args.max_files
            ),
            log=logging.getLogger("bench"),
        )
        collector = CheckpointCollector(context)
        runs = []
        truncated = 1.0
        while truncated and len(runs) < 10 * args.saves:
            started = time.monotonic()
            families = list(collector.collect())
            runs.append(time.monotonic() - started)
            truncated = next(f for f in families if f.name == "lockstep_checkpoint_scan_truncated").samples[0].value
        print(
            f"max_files {args.max_files}: {len(runs)} runs until every save was walked once "
            f"(first {runs[0] * 1000:.0f} ms, slowest {max(runs) * 1000:.0f} ms)"
        )
        steady = [0.0] * 20
        for i in range(20):
            started = time.monotonic()
            list(collector.collect())
            steady[i] = time.monotonic() - started
        print(
            f"steady state (all {args.saves} saves known complete): "
            f"p50 {statistics.median(steady) * 1000:.2f} ms, max {max(steady) * 1000:.2f} ms per run"
        )
        collector.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
