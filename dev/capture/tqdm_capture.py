"""Capture what a job's output holds when a tqdm progress bar shares its stream, or when it is
written through a terminal (issue 46): the frameworks' captured lines (tests/fixtures/
framework_logs/{megatron,nemo,torchtitan}.log) written the ways a job writes them.

Run with an interpreter that has tqdm (not part of Lockstep; no GPU, nothing else)::

    python3 -m venv /tmp/tqdm && /tmp/tqdm/bin/pip install tqdm==4.70.1
    /tmp/tqdm/bin/python dev/capture/tqdm_capture.py          # writes tests/fixtures/framework_logs/tqdm/

What runs is tqdm's own code: a bar over the job's step lines (``mininterval=0``, so every
update is drawn, as a bar over slow training steps is), updated once a line, and the line
written the way a job writes it:

- ``*-tqdm-write.out``: with ``tqdm.write`` (Lightning and NeMo callbacks print through it):
  tqdm clears its bar (``\\r``, spaces, ``\\r``), writes the line, draws the bar again;
- ``*-tqdm-print.out``: with ``print`` to the same stream: the line lands after the bar's text;
- ``pty-*.out``: the process's stdout is a terminal (``srun --pty``, a ``tty: true``
  container): what the terminal's other end reads, each newline made ``\\r\\n`` by the line
  discipline (``onlcr``); NeMo's with its bar and ``tqdm.write``, Megatron's and torchtitan's plain.

A file written directly (``*-tqdm-*.out``) is what Slurm's StdOut holds; a terminal's is what a
``tty: true`` container's log or a ``script``-recorded ``srun --pty`` session holds.  The bar's
times and rates are the capture's own: they vary from one capture to the next.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import sys
import termios
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

HERE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "framework_logs"
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "tqdm"


def lines(name: str) -> list[str]:
    return (HERE / f"{name}.log").read_text().splitlines()


def with_bar(out: TextIO, text: list[str], how: str) -> None:
    """Each line written after one update of a bar on ``out``, by ``tqdm.write`` or ``print``."""
    bar = tqdm(total=len(text), file=out, mininterval=0, miniters=1, desc="Training")
    for line in text:
        bar.update(1)
        if how == "write":
            tqdm.write(line, file=out)
        else:
            print(line, file=out, flush=True)
    bar.close()


def to_file(name: str, framework: str, how: str) -> None:
    with open(OUT / name, "w") as out:
        with_bar(out, lines(framework), how)


def through_a_terminal(name: str, framework: str, bar: bool) -> None:
    """Run the writer with its stdout on a pty (100 columns) and keep what the master reads."""
    pid, master = pty.fork()
    if pid == 0:
        fcntl.ioctl(sys.stdout.fileno(), termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        if bar:
            with_bar(sys.stdout, lines(framework), "write")
        else:
            for line in lines(framework):
                print(line, flush=True)
        sys.stdout.flush()
        os._exit(0)
    captured = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its terminal
            break
        if not chunk:
            break
        captured += chunk
    os.waitpid(pid, 0)
    os.close(master)
    (OUT / name).write_bytes(bytes(captured))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    to_file("nemo-tqdm-write.out", "nemo", "write")
    to_file("nemo-tqdm-print.out", "nemo", "print")
    to_file("megatron-tqdm-print.out", "megatron", "print")
    through_a_terminal("pty-nemo-tqdm-write.out", "nemo", bar=True)
    through_a_terminal("pty-megatron.out", "megatron", bar=False)
    through_a_terminal("pty-torchtitan.out", "torchtitan", bar=False)
    for path in sorted(OUT.glob("*.out")):
        print(f"{path}: {path.stat().st_size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
