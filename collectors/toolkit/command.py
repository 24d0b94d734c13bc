"""Running a command (``scontrol``) within a whole-exchange deadline and an output bound.

``subprocess.run(timeout=...)`` kills the direct child at the deadline, but not what it
started: a hung ``scontrol`` wrapper script leaves its children behind (13 in 60 s were seen),
and one of them holding the output pipe keeps ``run`` reading after the kill.  Here the
command runs in its own session (its own process group), and the whole group is killed at the
deadline, when its output passes the bound, and after it exits (nothing it started outlives
the exchange), and at the agent's exit any command still running is killed with its group
(``lockstep once`` used to exit leaving a hung one behind).  The output is read in chunks
up to ``max_output`` bytes: a 300 MB reply is refused after 4 MiB, not held whole.
"""

from __future__ import annotations

import atexit
import os
import selectors
import signal
import subprocess
import threading
import time

DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024

# Commands running now, so that exiting kills them (their threads are daemon threads, which
# the interpreter abandons at exit without unwinding them).
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


class CommandOutputError(subprocess.SubprocessError):
    """The command's output was too large or not text; the message names the command."""


def run_command(argv: list[str], timeout: float, max_output: int = DEFAULT_MAX_OUTPUT) -> str:
    """The command's stdout as text, once it exits 0 within ``timeout`` seconds.

    Raises subprocess.TimeoutExpired at the deadline, CalledProcessError for a non-zero exit
    (with its stderr), CommandOutputError for output past ``max_output`` bytes or output that
    is not UTF-8 text, OSError when it cannot be started.  Its process group is killed in
    every case.
    """
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with _running_lock:
        _running.add(proc)
    try:
        stdout, stderr = _read_bounded(proc, argv, deadline, timeout, max_output)
        remaining = deadline - time.monotonic()
        try:
            returncode = proc.wait(max(remaining, 0.001))
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(argv, timeout) from None
    finally:
        _kill_group(proc)
        with _running_lock:
            _running.discard(proc)
    name = os.path.basename(argv[0])
    if returncode != 0:
        raise subprocess.CalledProcessError(
            returncode, argv, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
        )
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandOutputError(f"{name} printed bytes that are not text (at byte {exc.start})") from None
    if "\0" in text:
        raise CommandOutputError(f"{name} printed bytes that are not text (a NUL at byte {text.index(chr(0))})")
    return text


def _read_bounded(
    proc: subprocess.Popen[bytes], argv: list[str], deadline: float, timeout: float, max_output: int
) -> tuple[bytes, bytes]:
    chunks: dict[int, list[bytes]] = {}
    sizes: dict[int, int] = {}
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            selector.register(stream.fileno(), selectors.EVENT_READ)
            chunks[stream.fileno()] = []
            sizes[stream.fileno()] = 0
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(argv, timeout)
            for key, _ in selector.select(remaining):
                fd = key.fd
                data = os.read(fd, 65536)
                if not data:
                    selector.unregister(fd)
                    continue
                chunks[fd].append(data)
                sizes[fd] += len(data)
                if sizes[fd] > max_output:
                    raise CommandOutputError(
                        f"{os.path.basename(argv[0])} printed more than {max_output} bytes; its output is ignored"
                    )
    assert proc.stdout is not None and proc.stderr is not None
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command's process group (it leads its own session) and reap the command."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is empty: everything in it has exited
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@atexit.register
def kill_running_commands() -> None:
    """Kill every command still running, with its process group (at exit)."""
    with _running_lock:
        running = list(_running)
    for proc in running:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
