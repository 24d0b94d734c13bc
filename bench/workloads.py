"""Cost of the workload collectors: training-log ingest and inference scrape rounds.

    .venv/bin/python bench/workloads.py [--ranks 16] [--steps 5000] [--targets 16]

Training: writes --ranks logs of --steps steps each (the emitter's format, ~640 B per
step), then times the first round reading them all from the beginning (lines/s), and
steady rounds after each rank appended 10 steps (the normal case: one interval's worth).
Inference: --targets real HTTP endpoints on 127.0.0.1 serving the simulated vLLM
exposition; times whole collection rounds (concurrent scrapes + normalisation).
No assertion: the machines are shared and noisy; read the figures.
"""

from __future__ import annotations

import argparse
import http.server
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lockstep.agent.collector import CollectorContext, Paths  # noqa: E402
from lockstep.collectors.inference import InferenceCollector, InferenceOptions  # noqa: E402
from lockstep.collectors.inference.targets import parse_targets  # noqa: E402
from lockstep.collectors.training import TrainingCollector, TrainingOptions  # noqa: E402
from lockstep.emitter import step_lines  # noqa: E402
from lockstep.simulation.workloads import vllm_exposition  # noqa: E402


def timed(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def context(options: object) -> CollectorContext:
    return CollectorContext(paths=Paths(), options=options, log=logging.getLogger("bench"))


def step(rank: int, k: int) -> str:
    return step_lines(
        job_id="1", rank=rank, host="h", step=k, ts=1_767_312_000 + k, step_time=1.6,
        compute_time=1.3, comm_wait_time=0.2, data_time=0.1, tokens=32768, samples=8,
    )  # fmt: skip


def bench_training(ranks: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for r in range(ranks):
            (root / f"rank-{r:03d}.metrics.jsonl").write_text("".join(step(r, k) for k in range(steps)))
        size = sum(p.stat().st_size for p in root.iterdir())
        lines = ranks * steps * 6
        collector = TrainingCollector(
            context(
                TrainingOptions(logs=(str(root / "rank-*.metrics.jsonl"),), start_at="beginning", idle_timeout=600.0)
            )
        )
        rounds = 0
        total_wall = total_cpu = 0.0
        while True:  # 16 MiB per file per round: a big backlog takes several rounds
            wall, cpu = timed(lambda: list(collector.collect()))
            total_wall, total_cpu, rounds = total_wall + wall, total_cpu + cpu, rounds + 1
            done = collector._ranks and all(s.steps == steps for s in collector._ranks.values())
            if done:
                break
        print(
            f"training backlog: {ranks} files, {size / 1e6:.1f} MB, {lines} lines in {rounds} round(s): "
            f"{total_wall:.2f} s wall, {total_cpu:.2f} s CPU, {lines / total_wall:,.0f} lines/s"
        )
        walls, cpus = [], []
        for i in range(20):
            for r in range(ranks):
                with open(root / f"rank-{r:03d}.metrics.jsonl", "a") as f:
                    f.write("".join(step(r, steps + i * 10 + k) for k in range(10)))
            time.sleep(0.05)  # let the watchdog thread read some of it, as between real rounds
            wall, cpu = timed(lambda: list(collector.collect()))
            walls.append(wall)
            cpus.append(cpu)
        collector.close()
        print(
            f"training steady round ({ranks} ranks x 10 new steps): median {statistics.median(walls) * 1e3:.1f} ms "
            f"wall, {statistics.median(cpus) * 1e3:.1f} ms CPU (includes the watchdog thread's reads)"
        )


def bench_inference(targets: int) -> None:
    body = vllm_exposition(0.0).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 128  # the default 5 drops concurrent connections for a second
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    collector = InferenceCollector(
        context(
            InferenceOptions(
                targets=parse_targets([f"vllm=http://127.0.0.1:{port}/e{i}" for i in range(targets)]),
                discover=True,
                timeout=3.0,
            )
        )
    )
    walls, cpus = [], []
    for _ in range(30):
        wall, cpu = timed(lambda: list(collector.collect()))
        walls.append(wall)
        cpus.append(cpu)
    collector.close()
    server.shutdown()
    print(
        f"inference round ({targets} vLLM targets of {len(body)} B each, plus process discovery on this "
        f"machine's /proc): median {statistics.median(walls) * 1e3:.1f} ms wall, "
        f"{statistics.median(cpus) * 1e3:.1f} ms CPU (all threads), max {max(walls) * 1e3:.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--targets", type=int, default=16)
    args = parser.parse_args()
    bench_training(args.ranks, args.steps)
    bench_inference(args.targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
