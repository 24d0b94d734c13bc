"""Real processes that look like inference engines to /proc, for the discovery tests and bench.

``LookalikeEngines`` starts one process named ``vllm`` (``python3 .../vllm serve ...``, as the
console script runs) that forks N children, each listening on its own 127.0.0.1 port: what any
user on a node can start (issue 29 items 6 and 7).  A child either answers every GET with a
vLLM exposition (``answer``) or never answers at all (``silent``: it listens and never accepts,
so the kernel completes the connection and the request waits for ever).

``procfs_view`` is a directory of symlinks to /proc/PID for the given processes (and
``self``): the collector reads real processes through it, and sees no other look-alike that
happens to run on the machine (other tests' fake engines), so its counts are exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = """#!{python}
import http.server, os, signal, socket, sys, time
args = sys.argv
count = int(args[args.index("--lookalikes") + 1])
mode = args[args.index("--mode") + 1]
first_port = int(args[args.index("--first-port") + 1])
body = open(args[args.index("--metrics-file") + 1], "rb").read() if mode == "answer" else b""
children, ports = [], []
port = first_port
for _ in range(count):
    while True:
        try:
            listener = socket.create_server(("127.0.0.1", port), backlog=128)
            break
        except OSError:
            port += 1
    ports.append(port)
    port += 1
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if mode == "silent":
            while True:
                time.sleep(3600)  # listens, never accepts: a request waits for ever
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            def log_message(self, *a):
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = listener
        server.serve_forever()
        os._exit(0)
    listener.close()  # the child's socket only: the parent listens on nothing
    children.append(pid)
def stop(*_):
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
print(" ".join(map(str, children)), flush=True)
print(" ".join(map(str, ports)), flush=True)
while True:
    time.sleep(3600)
"""

VLLM_BODY = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="llama"} 7.0\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{model_name="llama"} 0.25\n'
)


class LookalikeEngines:
    """N forked children of one ``vllm serve`` process, each on its own port from ``first_port`` up."""

    def __init__(
        self, directory: Path, count: int, mode: str, first_port: int, body: str = VLLM_BODY, user: int | None = None
    ) -> None:
        """``user``: the uid to run as (the caller must be root, and ``directory`` readable by it)."""
        directory.mkdir(parents=True, exist_ok=True)
        script = directory / "vllm"
        # Another user may not reach this interpreter (under /root): the system's then (stdlib only).
        python = sys.executable if user is None or not Path("/usr/bin/python3").exists() else "/usr/bin/python3"
        script.write_text(SCRIPT.format(python=python))
        script.chmod(0o755)
        metrics = directory / "metrics.txt"
        metrics.write_text(body)
        argv = [str(script), "serve", "llama", "--lookalikes", str(count), "--mode", mode]
        argv += ["--first-port", str(first_port), "--metrics-file", str(metrics)]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, start_new_session=True, user=user, group=user
        )
        assert self.process.stdout is not None
        self.children = [int(pid) for pid in self.process.stdout.readline().split()]
        self.ports = [int(port) for port in self.process.stdout.readline().split()]
        if len(self.ports) != count:
            self.stop()
            raise RuntimeError(f"look-alike engines did not start: {self.process.stdout.read()}")

    @property
    def pids(self) -> list[int]:
        return [self.process.pid, *self.children]

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}/metrics" for port in self.ports]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # kills its children, then exits
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        for child in self.children:  # reaped by init once the parent is gone; make sure
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass


def procfs_view(directory: Path, pids: list[int]) -> Path:
    """A procfs root that shows only ``pids`` (and ``self``): symlinks into /proc."""
    directory.mkdir(parents=True, exist_ok=True)
    for pid in [*pids, "self"]:
        link = directory / str(pid)
        if not link.is_symlink():
            link.symlink_to(f"/proc/{pid}")
    return directory
