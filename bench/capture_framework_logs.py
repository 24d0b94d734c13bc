"""Capture the training frameworks' step and checkpoint lines from their own formatting code.

Writes tests/fixtures/framework_logs/{megatron,nemo,torchtitan}.log, which
tests/collectors/framework_logs/ replay.  Opt-in, never part of the test run; needs the
frameworks' sources at the commits below (no GPU, no torch, no install: only the code that
formats the lines runs)::

    git -C Megatron-LM checkout d98e8a64ddf34856e74b24714e3bedb2f5a39553   # core_v0.15.0rc7+2333, 2026-08-22
    git -C NeMo checkout 8cfedd7203462cb251a914e700e5605444277561          # v2.5.0rc0+113, 2025-09-20
    git -C torchtitan checkout b5bcd76c66d0acb1a08b176d9639425bc55e0b2a    # 2026-08-21
    python bench/capture_framework_logs.py --megatron Megatron-LM --nemo NeMo --torchtitan torchtitan

The formatting of these lines is inline in large functions that need a GPU and a process group
(Megatron's ``training_log``, ``save_checkpoint``; NeMo's ``save_checkpoint``), so the script takes
the statements that build and print each line out of the source (Python's ``ast``, by a marker
string in them), and runs exactly those statements with the values a run would have, on a
simulated clock; where a whole function or method formats the line (torchtitan's
``MetricsProcessor.log``, NeMo's ``ProgressPrinter.format_string``, Megatron's
``_ValueWithRank.__str__``) the whole function runs.  A change of the format upstream changes
the captured lines: rerun at a new commit and let the tests say what no longer parses.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import logging
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "framework_logs"
START = datetime(2026, 8, 21, 10, 0, 0)


class Clock:
    """The simulated time the captured lines carry."""

    def __init__(self) -> None:
        self.now = START

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _source(root: Path, path: str) -> str:
    return (root / path).read_text()


def _segment(source: str, marker: str, kind: type[ast.AST], nth: int = 0) -> str:
    """The source of the ``nth`` node of ``kind`` whose text holds ``marker`` (innermost first)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, kind):
            text = ast.get_source_segment(source, node) or ""
            if marker in text:
                found.append((len(text), text))
    if len(found) <= nth:
        raise SystemExit(f"no {kind.__name__} holding {marker!r}: the source changed")
    return textwrap.dedent(sorted(found)[nth][1])


def _block(source: str, first: str, last: str) -> str:
    """The lines from the one holding ``first`` to the next holding ``last``, dedented."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return textwrap.dedent("\n".join(lines[start : end + 1]))


class _FakeDatetime:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def now(self) -> datetime:
        return self.clock.now

    def fromtimestamp(self, ts: float) -> datetime:
        return datetime.fromtimestamp(ts)


class _Scalar:
    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value

    def __truediv__(self, other: float) -> float:  # pragma: no cover - not used by the block
        return self.value / other


def megatron(root: Path) -> list[str]:
    clock = Clock()
    out: list[str] = []
    training = _source(root, "megatron/training/training.py")
    checkpointing = _source(root, "megatron/training/checkpointing.py")
    utils = _source(root, "megatron/core/utils.py")
    log_block = _block(training, 'log_string = f" [{datetime.now()', "print_rank_last(log_string)")
    saving = _segment(checkpointing, "saving checkpoint '", ast.Call)
    saved = _segment(checkpointing, "successfully saved '", ast.Call)
    value_with_rank = _segment(utils, "class _ValueWithRank", ast.ClassDef)
    straggler = _segment(utils, "MnRtt/Rnk", ast.Call)
    namespace: dict[str, Any] = {"Tuple": tuple}
    exec(value_with_rank, namespace)
    vwr = namespace["_ValueWithRank"]
    fake_datetime = _FakeDatetime(clock)
    args = SimpleNamespace(
        train_iters=500000,
        consumed_train_samples=0,
        skipped_train_samples=0,
        log_throughput=True,
        log_timers_to_tensorboard=False,
        log_energy=False,
        num_experts=None,
        perform_rl_step=False,
        rl_use_sequence_packing=False,
        save="/lustre/ckpt/llama-70b",
    )
    batch_size = 512
    iteration = 0
    # The first iteration is logged (start-up included), then every log_interval (100).
    schedule = [(1, 41.5632), *((i, 1.8342 + 0.0007 * (i // 100 % 3)) for i in range(100, 501, 100))]
    for number, seconds in schedule:
        done = number - iteration
        iteration = number
        args.consumed_train_samples = iteration * batch_size
        clock.advance(seconds * done)
        ns = {
            "datetime": fake_datetime,
            "args": args,
            "iteration": iteration,
            "has_rl_utils": False,
            "elapsed_time_per_iteration": seconds,
            "throughput": 401.2 + 0.1 * (iteration // 100),
            "writer": None,
            "wandb_writer": None,
            "learning_rate": 1.5e-4 * min(1.0, iteration / 200),
            "batch_size": batch_size,
            "get_telemetry": lambda: None,
            "total_loss_dict": {
                "lm loss": _Scalar(100 * (7.1234 - iteration / 1000)),
                "advanced iterations": 100,
                "skipped iterations": 0,
                "nan iterations": 0,
            },
            "advanced_iters_key": "advanced iterations",
            "skipped_iters_key": "skipped iterations",
            "nan_iters_key": "nan iterations",
            "should_reset": False,
            "moe_log_string": "",
            "loss_scale": 1.0,
            "grad_norm": 1.234,
            "num_zeros_in_grad": None,
            "params_norm": None,
            "print_rank_last": out.append,
        }
        exec(log_block, ns)
        if iteration in (200, 400):
            save_ns = {
                "datetime": fake_datetime,
                "iteration": iteration,
                "save_dir": args.save,
                "ckpt_format": "torch_dist",
                "args": args,
                "tensor_mp_rank": 1,
                "tp_size_to_print": 8,
                "gtp_remat_rank": 0,
                "gtp_remat_size_to_print": 1,
                "pipeline_mp_rank": 1,
                "pp_size_to_print": 1,
                "print_rank_0": out.append,
                "int": int,
            }
            eval(saving, save_ns)
            clock.advance(41.5)
            eval(saved, save_ns)
        if iteration % 100 == 0:
            o_dt = SimpleNamespace(
                min_elapsed=vwr(1801.22, 5, "ms"),
                max_elapsed=vwr(2210.90 if iteration >= 300 else 1840.10, 12, "ms"),
                min_power=vwr(612.0, 3, "W"),
                max_power=vwr(698.5, 9, "W"),
                min_temp=vwr(61.0, 2, "C"),
                max_temp=vwr(74.0, 12, "C"),
                min_util=vwr(97.0, 12, "%"),
                max_util=vwr(100.0, 0, "%"),
                min_clock=vwr(1755.0, 12, ""),
                max_clock=vwr(1980.0, 4, ""),
                min_btime=vwr(1.2, 7, "ms"),
                max_btime=vwr(3.4, 1, "ms"),
            )
            stamp = f"[{clock.now.strftime('%Y-%m-%d %H:%M:%S')}]"
            eval(
                straggler,
                {
                    "logger": SimpleNamespace(info=out.append),
                    "now": stamp,
                    "o_dt": o_dt,
                    "min_flops": 388.12,
                    "min_frank": 12,
                    "max_flops": 421.55,
                    "max_frank": 5,
                },
            )
    return out


def nemo(root: Path) -> list[str]:
    clock = Clock()
    out: list[str] = []
    printer = _source(root, "nemo/lightning/pytorch/callbacks/progress_printer.py")
    pl = _source(root, "nemo/lightning/io/pl.py")
    namespace: dict[str, Any] = {}
    exec(_segment(printer, "def format_string", ast.FunctionDef), namespace)
    format_string = namespace["format_string"]
    prefix = _segment(printer, "epoch {trainer.current_epoch}, iteration", ast.BinOp)
    save_block = _block(pl, "log_parts = (", 'log_message = " : ".join')
    total = 100
    for n in range(1, 31):
        seconds = 0.189 + (0.001 if n % 7 == 0 else 0.0)
        clock.advance(seconds)
        metrics = {
            "lr": 5.6e-06 * n / 28,
            "global_batch_size": 32.0,
            "global_step": float(n - 1),
            "reduced_train_loss": 2.778 + 0.0137 * (30 - n),
            "train_step_timing in s": seconds,
            "consumed_samples": float(32 * n),
        }
        self = SimpleNamespace(train_description="Training", total=total)
        trainer = SimpleNamespace(current_epoch=0)
        line = format_string(self, eval(prefix, {"self": self, "trainer": trainer, "n": n}), metrics)
        out.append(line)
        if n == 20:
            ns: dict[str, Any] = {
                "rank": 0,
                "iteration": 19,
                "start_time": clock.now.timestamp(),
                "end_time": clock.now.timestamp() + 12.345,
            }
            exec(save_block, ns)
            clock.advance(12.345)
            when = clock.now.strftime("%Y-%m-%d %H:%M:%S")
            out.append(f"[NeMo I {when} pl:220] {ns['log_message']}")  # NeMo's formatter (nemo/utils/formatters)
    return out


def torchtitan(root: Path) -> list[str]:
    clock = Clock()
    metrics_source = _source(root, "torchtitan/components/metrics.py")
    utils = _source(root, "torchtitan/tools/utils.py")
    spec = importlib.util.spec_from_file_location("titan_logging", root / "torchtitan/tools/logging.py")
    assert spec is not None and spec.loader is not None
    titan_logging = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(titan_logging)
    titan_logging.init_logger()  # torchtitan's own handler and formatter, on the root logger
    logger = titan_logging.logger
    captured: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            record.created = clock.now.timestamp()
            record.msecs = (record.created % 1) * 1000
            captured.append(self.format(record))

    titan_handler = logger.handlers[0]
    handler = Capture()
    handler.setFormatter(titan_handler.formatter)
    logger.handlers = [handler]
    namespace: dict[str, Any] = {}
    exec(_segment(utils, "class Color", ast.ClassDef), namespace)
    color = namespace["Color"]
    fake_time = SimpleNamespace(perf_counter=lambda: clock.now.timestamp())
    exec(
        _segment(metrics_source, "def log(\n        self,\n        step", ast.FunctionDef),
        log_ns := {"time": fake_time, "logger": logger, "Any": Any},
    )
    log = log_ns["log"]
    dcp = _source(root, "torchtitan/components/checkpointer/dcp.py")
    saving = _segment(dcp, "{checkpoint_phase.capitalize()} the checkpoint.", ast.Call)
    finished = _segment(dcp, "Finished {checkpoint_phase} the checkpoint in", ast.Call)
    stats = SimpleNamespace(
        max_active_gib=29.1,
        max_active_pct=36.8,
        max_reserved_gib=31.2,
        max_reserved_pct=39.43,
        num_alloc_retries=0,
        num_ooms=0,
    )
    self = SimpleNamespace(
        num_flops_per_token=6 * 8e9,
        ntokens_since_last_log=0,
        time_last_log=clock.now.timestamp(),
        parallel_dims=SimpleNamespace(non_data_parallel_size=1),
        has_quantization=False,
        gpu_peak_flops=989e12,
        config=SimpleNamespace(log_freq=10),
        data_loading_times=[0.01],
        device_memory_monitor=SimpleNamespace(get_peak_stats=lambda: stats, reset_peak_stats=lambda: None),
        logger=SimpleNamespace(log=lambda metrics, step: None),
        color=color,
    )
    step = 0
    for number in [1, *range(10, 101, 10)]:
        done = number - step
        step = number
        step_seconds = 2.1 if step <= 50 else 3.15  # from step 60, 1.5x slower
        clock.advance(done * step_seconds)
        self.ntokens_since_last_log = int(done * 8192 * 2.0)
        self.data_loading_times = [0.01]
        log(self, step, 7.1234 - step / 100, 7.3, 1.2345)
        if step == 50:
            save_ns = {
                "logger": logger,
                "checkpoint_phase": "saving",
                "time": SimpleNamespace(monotonic=lambda: clock.now.timestamp()),
                "begin": clock.now.timestamp(),
            }
            eval(saving, save_ns)
            clock.advance(12.34)
            eval(finished, save_ns)
    return captured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron", type=Path, required=True)
    parser.add_argument("--nemo", type=Path, required=True)
    parser.add_argument("--torchtitan", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, lines in (
        ("megatron", megatron(args.megatron)),
        ("nemo", nemo(args.nemo)),
        ("torchtitan", torchtitan(args.torchtitan)),
    ):
        (args.out / f"{name}.log").write_text("".join(line + "\n" for line in lines))
        print(f"{args.out / name}.log: {len(lines)} lines", file=sys.stderr)


if __name__ == "__main__":
    main()
