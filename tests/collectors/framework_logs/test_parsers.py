"""The frameworks' lines as their own formatting code wrote them (tests/fixtures/framework_logs,
bench/capture_framework_logs.py), each into the event it stands for, and what is refused."""

from __future__ import annotations

from datetime import datetime

import pytest

from lockstep.collectors.framework_logs.parsers import (
    BadLine,
    Iteration,
    SaveDone,
    SaveStarted,
    Straggler,
    parse_line,
    split_prefix,
    terminal_line,
)
from tests.support import FIXTURES

LOGS = FIXTURES / "framework_logs"


def events(name: str) -> list[object]:
    out = []
    for line in (LOGS / name).read_bytes().splitlines():
        rank, text = split_prefix(line)
        assert rank is None
        out.append(parse_line(text))
    return out


def local(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_megatron_lines_from_its_own_code() -> None:
    got = events("megatron.log")
    iterations = [e for e in got if isinstance(e, Iteration)]
    assert [(e.iteration, e.seconds_per_iteration, e.consumed_samples) for e in iterations] == [
        (1, 41.5632, 512),
        (100, 1.8349, 51200),
        (200, 1.8356, 102400),
        (300, 1.8342, 153600),
        (400, 1.8349, 204800),
        (500, 1.8356, 256000),
    ]
    assert iterations[1].printed_at == local("2026-08-21 10:03:43.218300")
    assert [e for e in got if isinstance(e, (SaveStarted, SaveDone))] == [
        SaveStarted("megatron", local("2026-08-21 10:06:46.778300")),
        SaveDone("megatron", None, local("2026-08-21 10:07:28.278300")),
        SaveStarted("megatron", local("2026-08-21 10:13:35.188300")),
        SaveDone("megatron", None, local("2026-08-21 10:14:16.688300")),
    ]
    stragglers = [e for e in got if isinstance(e, Straggler)]
    assert len(stragglers) == 5
    assert stragglers[0] == Straggler("megatron", 1.80122, 5, 1.8401, 12)
    assert stragglers[-1] == Straggler("megatron", 1.80122, 5, 2.2109, 12)
    assert None not in got


def test_megatron_before_timestamps_and_older_save_line() -> None:
    """Versions before 2024 print no [timestamp]; older saves say 'at iteration' (quoted from
    megatron/training/checkpointing.py of core_r0.5.0)."""
    line = (LOGS / "megatron.log").read_text().splitlines()[1]
    old = " " + line.split("] ", 1)[1]
    assert parse_line(old.encode()) == Iteration("megatron", 100, 1.8349, None, consumed_samples=51200)
    assert parse_line(b"  successfully saved checkpoint at iteration     200 to /ckpt") == SaveDone(
        "megatron", None, None
    )
    assert parse_line(b"saving checkpoint at iteration     200 to /ckpt") == SaveStarted("megatron", None)


def test_nemo_lines_from_its_own_code() -> None:
    got = events("nemo.log")
    iterations = [e for e in got if isinstance(e, Iteration)]
    assert [e.iteration for e in iterations] == list(range(30))
    assert iterations[6] == Iteration("nemo", 6, 0.19, None, consumed_samples=224)
    assert iterations[7] == Iteration("nemo", 7, 0.189, None, consumed_samples=256)
    assert [e for e in got if isinstance(e, SaveDone)] == [SaveDone("nemo", 12.345, None)]


def test_torchtitan_lines_from_its_own_code_colours_and_all() -> None:
    raw = (LOGS / "torchtitan.log").read_bytes().splitlines()
    assert b"\x1b[31mstep:" in raw[0]  # its colours, as printed by default
    got = events("torchtitan.log")
    steps = [e for e in got if isinstance(e, Iteration)]
    assert [e.iteration for e in steps] == [1, *range(10, 101, 10)]
    assert steps[1] == Iteration(
        "torchtitan", 10, None, local("2026-08-21 10:00:21.000"), tokens_per_second_per_device=7802.0
    )
    assert [e for e in got if isinstance(e, SaveDone)] == [
        SaveDone("torchtitan", 12.34, local("2026-08-21 10:01:57.339"))
    ]
    assert got.count(None) == 1  # "Saving the checkpoint.": a save's start says nothing we count


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        (b"[rank0]:[titan] 2026-08-21 10:00:21,000 - root - INFO - step: 10  loss:  7.0  tps: 7,802  mfu: 1%", 0),
        (b"12: [titan] 2026-08-21 10:00:21,000 - root - INFO - step: 10  loss:  7.0  tps: 7,802  mfu: 1%", 12),
    ],
)
def test_launcher_rank_prefixes(line: bytes, rank: int) -> None:
    got_rank, text = split_prefix(line)
    assert got_rank == rank
    event = parse_line(text)
    assert isinstance(event, Iteration) and event.iteration == 10


@pytest.mark.parametrize(
    "line",
    [
        b"iteration 5 done",  # the word, not the format
        b"validate step: 10  loss:  7.0  memory: 1GiB  tps: 100  ",  # torchtitan's validation line
        b"Validation: iteration 3/10",  # NeMo's validation progress
        b"Global Checkpoint Save : Rank: 3 : Iteration: 19 : Start time: 1.0s : Save duration: 12.345s",  # not rank 0
        b"my own print: saving checkpoint at iteration soon",
        b"loss: 3 step: 4 tps: 5",
        b"",
    ],
)
def test_lines_in_no_known_format_are_skipped(line: bytes) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    "line",
    [
        b" iteration      100/  500000 | consumed samples: 1 | elapsed time per iteration (ms): nan |",
        b" iteration      100/  500000 | consumed samples: 1 | elapsed time per iteration (ms): -5.0 |",
        b" iteration      100/  500000 | consumed samples: 1 | elapsed time per iteration (ms): 1e400 |",
        b" [2026-13-45 10:00:00.0] iteration      100/  500000 | elapsed time per iteration (ms): 1.0 |",
        b"Training epoch 0, iteration 28/99 | train_step_timing in s: inf | consumed_samples: 928",
        b"Training epoch 0, iteration 9999999999999/99 | train_step_timing in s: 1.0",
        b"[2026-08-21 10:00:00] | MnRtt/Rnk: 1.2.3ms/5 | MxRtt/Rnk: 2.0ms/1 | ",
    ],
)
def test_known_format_with_bad_fields_is_refused(line: bytes) -> None:
    with pytest.raises(BadLine) as refused:
        parse_line(line)
    assert refused.value.reason == "bad_value"


def known(raw: bytes) -> list[object]:
    """The events of a file's lines, read as a terminal shows them."""
    found = []
    for line in raw.split(b"\n"):
        rank, text = split_prefix(line)
        event = parse_line(text)
        if event is not None:
            found.append((rank, event))
    return found


@pytest.mark.parametrize(
    ("capture", "framework"),
    [
        ("nemo-tqdm-write.out", "nemo"),  # tqdm.write: the bar cleared (\r, spaces, \r) before each line
        ("nemo-tqdm-print.out", "nemo"),  # print: each line after the bar's text
        ("megatron-tqdm-print.out", "megatron"),
        ("pty-nemo-tqdm-write.out", "nemo"),  # through a terminal: \r\n, and the bar
        ("pty-megatron.out", "megatron"),
        ("pty-torchtitan.out", "torchtitan"),
    ],
)
def test_output_as_terminals_and_tqdm_write_it_reads_as_the_plain_lines(capture: str, framework: str) -> None:
    """tqdm's own output (dev/capture/tqdm_capture.py, tqdm 4.70.1) around the frameworks'
    lines, and those lines through a pty: every step and save of the plain capture, no more."""
    raw = (LOGS / "tqdm" / capture).read_bytes()
    assert b"\r" in raw
    plain = known((LOGS / f"{framework}.log").read_bytes())
    assert known(raw) == plain
    saves = [e for _, e in plain if isinstance(e, SaveDone)]
    assert saves  # issue 46: NeMo's and torchtitan's saves were lost to \r\n


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (b"text\r", b"text"),
        (b"text\r\r", b"text"),
        (b"\rbar 1%\rbar 2%\r      \rTraining epoch 0", b"Training epoch 0"),
        (b"[rank0]:\rbar 1%\r   \rTraining epoch 0\r", b"[rank0]:Training epoch 0"),
        (b"3: bar 1%\rstep", b"3: step"),
        (b"Training epoch 0\r     ", b"     "),  # cleared after: the terminal shows spaces
        (b"no carriage return", b"no carriage return"),
    ],
)
def test_terminal_line_is_the_last_piece_after_the_launchers_prefix(line: bytes, shown: bytes) -> None:
    assert terminal_line(line) == shown


@pytest.mark.parametrize(
    "line",
    [
        b"Training epoch 0, iteration 28/99 | train_step_timing in s: 1_000 | consumed_samples: 928",
        b"Training epoch 0, iteration 28/99 | train_step_timing in s: 0.2 | consumed_samples: 9_28",
        " iteration 100/ 5 | elapsed time per iteration (ms): \u0661\u0662 |".encode(),  # Arabic-Indic 12
        b" iteration 100/ 5 | elapsed time per iteration (ms): infinity |",
        b" iteration 100/ 5 | elapsed time per iteration (ms): 0x10 |",
    ],
)
def test_numbers_are_ascii_digits_as_printed(line: bytes) -> None:
    """Python's float() and int() take 1_000 and other scripts' digits: the frameworks print neither."""
    with pytest.raises(BadLine):
        parse_line(line)


def test_other_scripts_digits_are_no_iteration_number() -> None:
    line = "Training epoch 0, iteration \u0662\u0668/99 | train_step_timing in s: 0.2".encode()
    assert parse_line(line) is None
