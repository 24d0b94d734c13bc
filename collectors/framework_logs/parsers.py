"""The training frameworks' own output lines, matched by their format strings, into events.

Only these lines are recognised; every other line is skipped (the output of a job is mostly
something else), and a recognised line whose fields do not parse is refused by reason, never
guessed at.  Formats read in the frameworks' sources (the commits named are those read):

- Megatron-LM (NVIDIA/Megatron-LM d98e8a64dd, 2026-08-22, core_v0.15.0rc7+2333;
  ``training_log()`` in megatron/training/training.py), printed by the last rank every
  ``--log-interval`` iterations and after the first, the time being the mean over the
  iterations since the previous line::

     [2026-08-21 10:00:00.123456] iteration      100/  500000 | consumed samples:        51200 |
       elapsed time per iteration (ms): 1834.2 | ... |          (one line)

  fields are optional and reordered by flags (parsed by key); versions before 2024 have no
  ``[timestamp]``.  Saves (megatron/training/checkpointing.py, ``save_checkpoint``), rank 0::

    [2026-08-21 10:05:00.000000] saving checkpoint at iteration     200 to /ckpt in torch_dist format
      [2026-08-21 10:05:41.500000] successfully saved checkpoint from iteration     200 to /ckpt [ t 1/8, ... ]

  (older versions: ``successfully saved checkpoint at iteration``, no timestamp).  With
  ``--log-straggler``, ``StragglerDetector.report()`` (megatron/core/utils.py), rank 0::

    [2026-08-21 10:00:00] | MnRtt/Rnk: 1801.22ms/5 | MxRtt/Rnk: 2210.90ms/12 | MnPwr/Rnk: ... |

- NeMo 2 (NVIDIA/NeMo 8cfedd7203, 2025-09-20, v2.5.0rc0+113): ``ProgressPrinter``
  (nemo/lightning/pytorch/callbacks/progress_printer.py), global rank 0, ``print()`` without a
  timestamp, every ``log_interval`` (1) steps, values averaged over it, ``{val:.4}``::

    Training epoch 0, iteration 28/99 | lr: 5.6e-06 | global_step: 28 | reduced_train_loss: 2.778 |
      train_step_timing in s: 0.189 | consumed_samples: 928          (one line)

  Saves (nemo/lightning/io/pl.py, ``MegatronCheckpointIO.save_checkpoint``), through NeMo's logger::

    [NeMo I 2025-09-20 07:37:26 pl:220] Global Checkpoint Save : Rank: 0 : Iteration: 200 :
      Start time: 1758353834.101s : Save duration: 12.345s          (one line)

- torchtitan (pytorch/torchtitan b5bcd76c66, 2026-08-21; ``MetricsProcessor.log`` in
  torchtitan/components/metrics.py, the formatter of torchtitan/tools/logging.py), at step 1
  and every ``log_freq`` (10) steps, ANSI colours unless ``--metrics.disable_color_printing``::

    [titan] 2026-08-21 10:00:00,123 - root - INFO - step: 10  loss:  7.12340  grad_norm:  1.2345
      memory: 31.20GiB(39.43%)  tps: 7,625  tflops: 441.33  mfu: 44.62%          (one line)

  no step time (the time between two lines' timestamps, over the steps between them); ``tps``
  is tokens per second per device.  Saves (torchtitan/components/checkpointer/dcp.py)::

    [titan] ... - root - INFO - Finished saving the checkpoint in 12.34 seconds.
    [titan] ... - root - INFO - Last step checkpoint completed in 12.34s

  (``Finished staging`` for an asynchronous save: the part that stops training).

A launcher may prefix each line with the rank that printed it: torchrun's ``--role rank
--tee 3`` (``[rank0]:``, torchtitan's run_train.sh) and ``srun --label`` (``0: ``).

A line is read as a terminal shows it (``split_prefix``): output written through a terminal
(``srun --pty``, a ``tty: true`` container) ends its lines in ``\\r\\n``, and a progress bar on
the same stream (tqdm: Lightning's, NeMo's) redraws itself after a ``\\r`` with no newline, and
clears itself (``\\r``, spaces, ``\\r``) before ``tqdm.write`` writes a line; what the terminal
shows of such a line is its last ``\\r``-separated piece.  A ``print`` while a bar is drawn
lands after the bar's text, on the bar's line: Megatron's and NeMo's step and save lines are
found anywhere in a line (their formats are long and distinctive), torchtitan's, which its
logger writes from the line's start, at its start.  Numbers are ASCII digits as the frameworks
print them (``1_000`` and other digits Python would take are refused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

MEGATRON = "megatron"
NEMO = "nemo"
TORCHTITAN = "torchtitan"
FRAMEWORKS = (MEGATRON, NEMO, TORCHTITAN)

# Largest iteration number, seconds, tokens or samples a line may carry: far above any real
# job, below where float sums lose whole units.  A larger value is garbage, refused.
MAX_VALUE = 1e15
MAX_ITERATION = 10**12


class BadLine(ValueError):
    """A line in a recognised format whose fields do not parse: skipped and counted by ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Iteration:
    """A step report: the framework's iteration number, and what it says of the time since its last report."""

    framework: str
    iteration: int
    seconds_per_iteration: float | None  # Megatron, NeMo: the mean over the interval
    printed_at: float | None  # the line's own timestamp (naive local time read as the agent's)
    consumed_samples: int | None = None  # Megatron, NeMo: the job's total so far
    tokens_per_second_per_device: float | None = None  # torchtitan


@dataclass(frozen=True)
class SaveStarted:
    framework: str
    printed_at: float | None


@dataclass(frozen=True)
class SaveDone:
    framework: str
    seconds: float | None  # as printed (NeMo, torchtitan); Megatron: None, from the start line
    printed_at: float | None


@dataclass(frozen=True)
class Straggler:
    """Megatron's straggler report: the fastest and slowest rank's time per iteration."""

    framework: str
    fastest_seconds: float
    fastest_rank: int
    slowest_seconds: float
    slowest_rank: int


Event = Iteration | SaveStarted | SaveDone | Straggler

_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")
_PREFIX_STARTS = b"[0123456789 \t\x1b"
_RANK_PREFIX = re.compile(rb"^\s*(?:\[rank(\d{1,7})\]:|(\d{1,7}): )")

_TS = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?)\]"
# Megatron's lines anywhere in a line (after a progress bar's text), with their timestamp if any.
_MEGATRON_ITERATION = re.compile(r"(?:" + _TS + r"\s*)?\biteration\s+(\d{1,13})/\s*(\d{1,13}) \|(.*)$", re.ASCII)
_MEGATRON_SAVING = re.compile(r"(?:" + _TS + r" )?\bsaving checkpoint at iteration\s+\d{1,13} to ", re.ASCII)
_MEGATRON_SAVED = re.compile(
    r"(?:" + _TS + r" )?\bsuccessfully saved checkpoint (?:from|at) iteration\s+\d{1,13} ", re.ASCII
)
_MEGATRON_STRAGGLER = re.compile(
    _TS + r" \| MnRtt/Rnk: ([0-9.]{1,20})ms/(\d{1,7}) \| MxRtt/Rnk: ([0-9.]{1,20})ms/(\d{1,7}) \|", re.ASCII
)
_NEMO_START = b"Training epoch "
_NEMO_ITERATION = re.compile(r"^Training epoch \d{1,9}, iteration (\d{1,13})/-?\d{1,13}((?: \| [^|]*)*)$", re.ASCII)
_NEMO_SAVE = re.compile(
    r"Global Checkpoint Save : Rank: (\d{1,7}) : (?:Iteration: \d{1,13} : )?"
    r"Start time: [0-9.]{1,30}s : Save duration: ([0-9.]{1,20})s$",
    re.ASCII,
)
_TITAN_TS = r"(?:\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - \S+ - INFO - )?"
_TITAN_STEP = re.compile(r"^" + _TITAN_TS + r"step:\s*(\d{1,13})\s+loss:.*\stps: ([0-9,]{1,24})\s", re.ASCII)
_TITAN_SAVE = re.compile(
    r"^"
    + _TITAN_TS
    + r"(?:Finished (?:saving|staging) the checkpoint in ([0-9.]{1,20}) seconds\.|"
    + r"Last step checkpoint completed in ([0-9.]{1,20})s)$",
    re.ASCII,
)
# A number as the frameworks print it: ASCII digits, a point, an exponent ("5.6e-06", "1834.2").
# float() would also take "1_000", " 1", "inf" and other scripts' digits.
_NUMBER = re.compile(rb"[0-9]{1,30}(?:\.[0-9]{0,30})?(?:[eE][-+]?[0-9]{1,3})?|\.[0-9]{1,30}(?:[eE][-+]?[0-9]{1,3})?")


def terminal_line(data: bytes) -> bytes:
    """What a terminal shows of ``data``: its last ``\\r``-separated piece that writes anything
    (a ``\\r\\n`` ending, a progress bar's redraws and clears before it), after the launcher's
    rank prefix, which the launcher wrote at the line's start."""
    data = data.rstrip(b"\r")
    if b"\r" not in data:
        return data
    prefix = _RANK_PREFIX.match(data)
    head = data[: prefix.end()] if prefix is not None and b"\r" not in prefix.group(0) else b""
    return head + data[len(head) :].rsplit(b"\r", 1)[1]


def split_prefix(data: bytes) -> tuple[int | None, bytes]:
    """(the launcher's rank prefix or None, the line as a terminal shows it (``terminal_line``),
    without the prefix and without ANSI colours)."""
    if b"\r" in data:
        data = terminal_line(data)
    if data[:1] not in _PREFIX_STARTS:
        return None, data  # the common case, without a regular expression
    if b"\x1b" in data:
        data = _ANSI.sub(b"", data)
    match = _RANK_PREFIX.match(data)
    if match is None:
        return None, data
    return int(match.group(1) or match.group(2)), data[match.end() :]


def _number(text: str) -> float:
    if _NUMBER.fullmatch(text.encode("utf-8", "replace")) is None:
        raise BadLine("bad_value")
    value = float(text)
    if not 0 <= value <= MAX_VALUE:  # False for NaN, inf
        raise BadLine("bad_value")
    return value


def _milliseconds(text: str) -> float:
    """Printed milliseconds -> seconds, without the binary noise of the division (41.563199999999995)."""
    return round(_number(text) / 1000.0, 9)


def _integer(text: str) -> int:
    value = int(text)
    if value > MAX_ITERATION:
        raise BadLine("bad_value")
    return value


def _local_time(text: str) -> float:
    """'2026-08-21 10:00:00.123456' or '... 10:00:00,123' (naive: local time) -> Unix seconds."""
    try:
        return datetime.fromisoformat(text.replace(",", ".")).timestamp()
    except (ValueError, OverflowError, OSError):
        raise BadLine("bad_value") from None


def _fields(text: str) -> dict[str, str]:
    """' key: value | key: value |' -> {key: value}; a segment without ': ' is left out."""
    fields = {}
    for segment in text.split("|"):
        key, sep, value = segment.partition(": ")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def parse_line(data: bytes) -> Event | None:
    """One line (prefix and colours removed) -> an event, None for a line in no known format.
    Raises BadLine for a line in a known format with a field that does not parse."""
    # Cheap tests on the bytes first: most lines of a job's output are none of these.
    if b"iteration" in data:
        if b"elapsed time per iteration (ms):" in data:
            return _megatron_iteration(data)
        start = data.find(_NEMO_START)
        if start >= 0:
            return _nemo_iteration(data[start:])
        if b"saving checkpoint at iteration" in data:
            match = _MEGATRON_SAVING.search(_text(data))
            if match:
                return SaveStarted(MEGATRON, _local_time(match.group(1)) if match.group(1) else None)
            return None
        if b"successfully saved checkpoint" in data:
            match = _MEGATRON_SAVED.search(_text(data))
            if match:
                return SaveDone(MEGATRON, None, _local_time(match.group(1)) if match.group(1) else None)
            return None
        return None
    if b"step:" in data and b"tps:" in data:
        return _titan_step(data)
    if b"Global Checkpoint Save" in data:
        match = _NEMO_SAVE.search(_text(data))
        if match is None:
            return None
        if match.group(1) != "0":
            return None  # every rank may log its save: rank 0's stands for the job's
        return SaveDone(NEMO, _number(match.group(2)), None)
    if b"the checkpoint in" in data or b"Last step checkpoint completed" in data:
        match = _TITAN_SAVE.match(_text(data))
        if match is None:
            return None
        seconds = match.group(2) or match.group(3)
        return SaveDone(TORCHTITAN, _number(seconds), _local_time(match.group(1)) if match.group(1) else None)
    if b"MnRtt/Rnk:" in data:
        match = _MEGATRON_STRAGGLER.search(_text(data))
        if match is None:
            return None
        return Straggler(
            MEGATRON,
            _milliseconds(match.group(2)),
            int(match.group(3)),
            _milliseconds(match.group(4)),
            int(match.group(5)),
        )
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _megatron_iteration(data: bytes) -> Iteration | None:
    match = _MEGATRON_ITERATION.search(_text(data))
    if match is None:
        return None
    stamp, iteration, _total, rest = match.groups()
    fields = _fields(rest)
    elapsed = fields.get("elapsed time per iteration (ms)")
    if elapsed is None:
        raise BadLine("bad_value")
    consumed = fields.get("consumed samples")
    return Iteration(
        MEGATRON,
        _integer(iteration),
        _milliseconds(elapsed),
        _local_time(stamp) if stamp else None,
        consumed_samples=int(_number(consumed)) if consumed is not None else None,
    )


def _nemo_iteration(data: bytes) -> Iteration | None:
    match = _NEMO_ITERATION.match(_text(data))
    if match is None:
        return None
    iteration, rest = match.groups()
    fields = _fields(rest)
    timing = fields.get("train_step_timing in s")
    consumed = fields.get("consumed_samples")
    return Iteration(
        NEMO,
        _integer(iteration),
        _number(timing) if timing is not None else None,
        None,
        consumed_samples=int(_number(consumed)) if consumed is not None else None,
    )


def _titan_step(data: bytes) -> Iteration | None:
    text = _text(data)
    match = _TITAN_STEP.match(text)
    if match is None:
        return None
    stamp, step, tps = match.groups()
    return Iteration(
        TORCHTITAN,
        _integer(step),
        None,
        _local_time(stamp) if stamp else None,
        tokens_per_second_per_device=_number(tps.replace(",", "")),
    )
