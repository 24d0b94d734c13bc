"""The HTTP endpoint under crowds and slowloris, side by side with node_exporter on this machine.

    .venv/bin/python bench/http_load.py [--duration 3] [--slowloris 1000] [--tasks-max 256]

Starts `lockstep demo` (the simulated node, as its own process) and node_exporter (Debian
``prometheus-node-exporter``, default collectors, on a free port), then for each:

1. Scrapers: 1, 8, 32 and 128 concurrent clients scraping /metrics for --duration seconds, each
   at a fixed interval from a random phase, as Prometheus servers do, --rate scrapes a second
   in all (--rate 0: back to back, which measures throughput and queueing instead); once over
   keep-alive connections (as Prometheus does) and once with a new connection per scrape;
   p50/p99/max latency, scrapes done and failed, the server's CPU per scrape.  The clients run
   in 4 processes so that the client's own GIL does not cap the load.
2. Slowloris: --slowloris connections that each send a request line and then one header line
   a second, never finishing; an attacker that reopens what the server closes (once a second).
   Meanwhile one scraper scrapes every 100 ms over keep-alive (a request that fails on a reused
   connection is retried once on a new one, as Go's and Python's clients do); scrape latency,
   failed scrapes, and the server's threads and RSS (max over the attack, against before).
3. Password flood: --flood-clients clients send wrong passwords (a new one each time) back to
   back for --flood-seconds; the server's CPU in cores, the answers by status, and a real
   scrape's latency meanwhile.  Both servers run with the same basic-auth web config (bcrypt
   cost 10), and every scrape carries the right password.
4. Release: every attacker connection still open completes its request at once; peak RSS over
   the next 3 s, RSS after, and the first scrape's latency.

With --tasks-max N (root, cgroup v1 or v2 pids controller), each server runs in its own pids
cgroup with pids.max N, as the systemd unit's TasksMax does; removed afterwards.
Prints figures only; no pass/fail (the machine is shared: compare the two servers' columns).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import multiprocessing
import os
import random
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONCURRENCY = (1, 8, 32, 128)
CLIENT_PROCESSES = 4
# Both servers run with basic auth (a bcrypt hash of cost 10, as `htpasswd -nBC 10` makes), so
# that scrapes pay for the remembered check and the flood phase can guess passwords.
USER, PASSWORD = "prometheus", "bench-secret"
# The guessers connect from another loopback address, as an attacker is another host than the
# Prometheus server (the agent bounds pending password checks per client address).
FLOOD_SOURCE = ("127.0.0.2", 0)
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def established(port: int) -> int:
    """Established connections to ``port`` (from /proc/net/tcp*): the ones the server holds plus
    those the kernel completed and queued in the listen backlog, not yet accepted."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
                count += 1
    return count


def rss_mib(pid: int) -> float:
    return proc_status(pid, "VmRSS") / 1024


def threads(pid: int) -> int:
    return proc_status(pid, "Threads")


def wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(400):
        if process.poll() is not None:
            sys.exit(f"{what} exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not answer on port {port}")


# --- scrapers ----------------------------------------------------------------------------


def scrape_once(port: int, conn: http.client.HTTPConnection | None) -> tuple[http.client.HTTPConnection | None, bool]:
    """One scrape; returns the connection to reuse (None: make a new one) and whether it succeeded."""
    for attempt in (0, 1):
        reused = conn is not None
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip", **AUTH})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                conn.close()
                return None, False
            if response.will_close:
                conn.close()
                return None, True
            return conn, True
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = None
            if not reused or attempt:
                return None, False
    return None, False


def client_process(
    port: int, clients: int, keep_alive: bool, duration: float, start_at: float, interval: float
) -> tuple[list[float], int]:
    """Runs ``clients`` scraping threads; returns their latencies (ms) and failure count.

    Each scraper starts a scrape every ``interval`` seconds from a random phase, as Prometheus
    servers do (0: back to back, as fast as the server answers).
    """
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()

    def scraper(phase: float) -> None:
        mine: list[float] = []
        failed = 0
        conn = None
        next_at = start_at + phase
        end = start_at + duration
        while True:
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            if time.time() >= end:
                break
            next_at += interval
            started = time.perf_counter()
            conn, ok = scrape_once(port, conn)
            if not keep_alive and conn is not None:
                conn.close()
                conn = None
            if ok:
                mine.append((time.perf_counter() - started) * 1000)
            else:
                failed += 1
        if conn is not None:
            conn.close()
        with lock:
            latencies.extend(mine)
            failures[0] += failed

    workers = [threading.Thread(target=scraper, args=(random.uniform(0, interval),)) for _ in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return latencies, failures[0]


def crowd(
    pid: int, port: int, concurrency: int, keep_alive: bool, duration: float, rate: float
) -> tuple[list[float], int, float]:
    """Latencies (sorted, ms), failures, and the server's CPU ms per scrape."""
    processes = min(CLIENT_PROCESSES, concurrency)
    per_process = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    interval = concurrency / rate if rate else 0.0
    start_at = time.time() + 0.5
    cpu_before = cpu_seconds(pid)
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        results = pool.starmap(
            client_process, [(port, n, keep_alive, duration, start_at, interval) for n in per_process]
        )
    cpu = cpu_seconds(pid) - cpu_before
    latencies = sorted(x for lat, _ in results for x in lat)
    return latencies, sum(f for _, f in results), cpu * 1000 / max(1, len(latencies))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- slowloris ---------------------------------------------------------------------------


class Slowloris:
    """``count`` connections that never finish their request; closed ones reopened once a second."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.socks: dict[int, socket.socket] = {}
        self.stop = threading.Event()
        self.reopened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        # A fixed number per round: a server that closes connections as fast as they open
        # (evicting at its cap) must not turn this into a tight loop.
        for _ in range(self.count - len(self.socks)):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                sock.connect_ex(("127.0.0.1", self.port))
            except OSError:
                sock.close()
                return
            self.socks[sock.fileno()] = sock
            self._send(sock, b"GET /metrics HTTP/1.1\r\nHost: bench\r\n")

    def _send(self, sock: socket.socket, data: bytes) -> None:
        try:
            sock.send(data)
        except (BlockingIOError, InterruptedError):
            pass  # still connecting: the next round sends
        except OSError:
            self.socks.pop(sock.fileno(), None)
            sock.close()

    def _run(self) -> None:
        self._open()
        while not self.stop.wait(1.0):
            for sock in list(self.socks.values()):
                self._send(sock, b"X-Trickle: 1\r\n")
            selector = selectors.DefaultSelector()  # drop the ones the server closed
            for sock in self.socks.values():
                selector.register(sock, selectors.EVENT_READ)
            for key, _ in selector.select(timeout=0):
                sock = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(4096)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if not data or data.startswith(b"HTTP/"):
                    self.socks.pop(sock.fileno(), None)  # type: ignore[union-attr]
                    sock.close()  # type: ignore[union-attr]
                    self.reopened += 1
            selector.close()
            self._open()

    def start(self) -> None:
        self.thread.start()

    def release(self) -> int:
        """Finish every open connection's request at once."""
        self.stop.set()
        self.thread.join()
        for sock in list(self.socks.values()):
            self._send(sock, b"\r\n")
        return len(self.socks)

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        self.socks.clear()


def slowloris_phase(pid: int, port: int, count: int, seconds: float) -> dict[str, float]:
    base_threads, base_rss = threads(pid), rss_mib(pid)
    attack = Slowloris(port, count)
    attack.start()
    time.sleep(2)  # let it connect
    latencies: list[float] = []
    failures = 0
    max_threads, max_rss = 0, 0.0
    conn = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        conn, ok = scrape_once(port, conn)
        if ok:
            latencies.append((time.perf_counter() - started) * 1000)
        else:
            failures += 1
        max_threads, max_rss = max(max_threads, threads(pid)), max(max_rss, rss_mib(pid))
        time.sleep(0.1)
    held = established(port)
    released = attack.release()
    peak_after = 0.0
    started = time.perf_counter()
    first_conn, ok = scrape_once(port, None)
    first_scrape = (time.perf_counter() - started) * 1000 if ok else float("nan")
    if first_conn is not None:
        first_conn.close()
    for _ in range(30):
        peak_after = max(peak_after, rss_mib(pid))
        time.sleep(0.1)
    attack.close()
    if conn is not None:
        conn.close()
    time.sleep(1)
    latencies.sort()
    return {
        "base_threads": base_threads,
        "base_rss": base_rss,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "max": latencies[-1] if latencies else float("nan"),
        "scrapes": len(latencies),
        "failed": failures,
        "max_threads": max_threads,
        "max_rss": max_rss,
        "held": held,
        "released": released,
        "first_scrape": first_scrape,
        "peak_rss_after": peak_after,
        "rss_after": rss_mib(pid),
    }


# --- password flood ----------------------------------------------------------------------


def flood_process(port: int, clients: int, seconds: float) -> dict[int, int]:
    """``clients`` threads sending wrong passwords (each one new) back to back; counts by status."""
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def guesser() -> None:
        mine: dict[int, int] = {}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=FLOOD_SOURCE)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            guess = base64.b64encode(f"{USER}:{random.getrandbits(64):x}".encode()).decode()
            try:
                conn.request("GET", "/metrics", headers={"Authorization": "Basic " + guess})
                response = conn.getresponse()
                response.read()
                mine[response.status] = mine.get(response.status, 0) + 1
                if response.will_close:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=FLOOD_SOURCE)
            except (OSError, http.client.HTTPException):
                mine[0] = mine.get(0, 0) + 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=FLOOD_SOURCE)
        conn.close()
        with lock:
            for status, count in mine.items():
                statuses[status] = statuses.get(status, 0) + count

    workers = [threading.Thread(target=guesser) for _ in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return statuses


def flood_phase(pid: int, port: int, clients: int, seconds: float) -> dict[str, object]:
    """CPU the server spends while ``clients`` guess passwords, and a real scrape's latency meanwhile."""
    processes = min(CLIENT_PROCESSES, clients)
    per_process = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pending = pool.starmap_async(flood_process, [(port, n, seconds) for n in per_process])
        latencies: list[float] = []
        failed = 0
        conn = None
        time.sleep(0.5)
        while not pending.ready():
            started = time.perf_counter()
            conn, ok = scrape_once(port, conn)
            if ok:
                latencies.append((time.perf_counter() - started) * 1000)
            else:
                failed += 1
            time.sleep(0.1)
        results = pending.get()
    cores = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)
    if conn is not None:
        conn.close()
    statuses: dict[int, int] = {}
    for result in results:
        for status, count in result.items():
            statuses[status] = statuses.get(status, 0) + count
    latencies.sort()
    return {"cores": cores, "statuses": statuses, "latencies": latencies, "failed": failed}


# --- servers -----------------------------------------------------------------------------


@contextmanager
def pids_cgroup(name: str, tasks_max: int | None) -> Iterator[Path | None]:
    """A pids cgroup limited to ``tasks_max`` tasks (like systemd's TasksMax), removed afterwards."""
    if tasks_max is None:
        yield None
        return
    group = pids_cgroup_root() / f"lockstep-bench-{name}-{os.getpid()}"
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(tasks_max))
    except OSError as exc:
        sys.exit(f"--tasks-max needs a writable pids cgroup (root): {exc}")
    try:
        yield group
    finally:
        for _ in range(50):  # the server's tasks leave the group as they exit
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def pids_cgroup_root() -> Path:
    """cgroup v1's pids hierarchy, or the v2 unified one."""
    v1 = Path("/sys/fs/cgroup/pids")
    return v1 if (v1 / "cgroup.procs").exists() else Path("/sys/fs/cgroup")


@contextmanager
def lockstep_agent(port: int, group: Path | None, web_config: Path) -> Iterator[subprocess.Popen[bytes]]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.yml"
        config.write_text("log_level: warning\n")
        argv = [sys.executable, "-m", "lockstep.agent.cli", "demo", "--scenario", "healthy", "--config", str(config),
                "--listen", f"127.0.0.1:{port}", f"--web.config.file={web_config}"]  # fmt: skip
        with started("lockstep", argv, group) as process:
            wait_listening(port, process, "lockstep")
            time.sleep(2)  # collectors' first rounds
            yield process


def node_exporter_binary() -> str:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        sys.exit("node_exporter not found: apt-get install prometheus-node-exporter (dev/debian-packages.d)")
    return binary


@contextmanager
def node_exporter(port: int, group: Path | None, web_config: Path) -> Iterator[subprocess.Popen[bytes]]:
    argv = [node_exporter_binary(), f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={web_config}"]
    with started("node_exporter", argv, group) as process:
        wait_listening(port, process, "node_exporter")
        yield process


@contextmanager
def started(name: str, argv: list[str], group: Path | None) -> Iterator[subprocess.Popen[bytes]]:
    def enter_group() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    # The server's log, for when a figure looks wrong.
    with open(Path(tempfile.gettempdir()) / f"http_load-{name}.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=enter_group)
    try:
        yield process
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL after 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def measure(name: str, process: subprocess.Popen[bytes], port: int, args: argparse.Namespace) -> dict:
    print(f"  {name}: scrapers ...", file=sys.stderr, flush=True)
    rows = {}
    for keep_alive in (True, False):
        for concurrency in CONCURRENCY:
            rows[(keep_alive, concurrency)] = crowd(
                process.pid, port, concurrency, keep_alive, args.duration, args.rate
            )
    print(f"  {name}: password flood ...", file=sys.stderr, flush=True)
    flood = flood_phase(process.pid, port, args.flood_clients, args.flood_seconds)
    print(f"  {name}: slowloris ...", file=sys.stderr, flush=True)
    attack = slowloris_phase(process.pid, port, args.slowloris, args.attack_seconds)
    return {"rows": rows, "attack": attack, "flood": flood}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per scraper cell")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="scrapes per second from all scrapers together (0: back to back)"
    )
    parser.add_argument("--slowloris", type=int, default=1000, help="slowloris connections")
    parser.add_argument("--attack-seconds", type=float, default=15.0)
    parser.add_argument("--flood-clients", type=int, default=16, help="clients guessing passwords")
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--tasks-max", type=int, default=None, help="run each server in a pids cgroup of this size")
    parser.add_argument("--only", choices=("lockstep", "node_exporter"), help="measure one server")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's 1000 sockets

    import bcrypt

    web_dir = tempfile.TemporaryDirectory()
    web_config = Path(web_dir.name) / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web_config.write_text(f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    results = {}
    servers = {"lockstep": lockstep_agent, "node_exporter": node_exporter}
    for name, start in servers.items():
        if args.only and name != args.only:
            continue
        port = free_port()
        with pids_cgroup(name, args.tasks_max) as group, start(port, group, web_config) as process:
            results[name] = measure(name, process, port, args)

    names = list(results)
    cores = os.cpu_count()
    tasks = f", pids.max {args.tasks_max}" if args.tasks_max else ""
    pace = f"{args.rate:g} scrapes/s in all" if args.rate else "back to back"
    print(f"HTTP load, {cores} cores, {args.duration:g} s per cell, {pace}{tasks}")
    print("latency in ms: p50 / p99 / max, then scrapes done, failed, and the server's CPU ms per scrape")
    print(f"{'':<18}" + "".join(f"{n:<50}" for n in names))
    for keep_alive in (True, False):
        for concurrency in CONCURRENCY:
            label = f"{concurrency:>3} {'keep-alive' if keep_alive else 'new conn'}"
            cells = []
            for n in names:
                latencies, failed, cpu = results[n]["rows"][(keep_alive, concurrency)]
                cells.append(
                    f"{percentile(latencies, 0.5):7.1f} /{percentile(latencies, 0.99):7.1f} /"
                    f"{(latencies[-1] if latencies else float('nan')):7.1f} {len(latencies):6d} {failed:4d} {cpu:5.2f}"
                )
            print(f"{label:<18}" + "".join(f"{c:<50}" for c in cells))
    print(f"\n{args.flood_clients} clients guessing passwords for {args.flood_seconds:g} s, one real scrape per 100 ms")
    flood_rows = (
        ("server CPU, cores", lambda f: f"{f['cores']:.2f}"),
        (
            "guesses answered by status",
            lambda f: " ".join(f"{k or 'err'}:{v}" for k, v in sorted(f["statuses"].items())),
        ),
        (
            "scrape p50 / p99 ms",
            lambda f: f"{percentile(f['latencies'], 0.5):.1f} / {percentile(f['latencies'], 0.99):.1f}",
        ),
        ("scrapes ok / failed", lambda f: f"{len(f['latencies'])} / {f['failed']}"),
    )
    print(f"{'':<30}" + "".join(f"{n:<30}" for n in names))
    for label, fmt in flood_rows:
        print(f"{label:<30}" + "".join(f"{fmt(results[n]['flood']):<30}" for n in names))
    print(f"\n{args.slowloris} slowloris connections for {args.attack_seconds:g} s, one scrape per 100 ms meanwhile")
    rows = (
        ("scrape p50 / p99 / max ms", lambda a: f"{a['p50']:.1f} / {a['p99']:.1f} / {a['max']:.1f}"),
        ("scrapes ok / failed", lambda a: f"{a['scrapes']} / {a['failed']}"),
        ("threads before -> max", lambda a: f"{a['base_threads']} -> {a['max_threads']}"),
        ("RSS MiB before -> max", lambda a: f"{a['base_rss']:.1f} -> {a['max_rss']:.1f}"),
        ("established to the port", lambda a: f"{a['held']}"),
        ("released at once", lambda a: f"{a['released']}"),
        ("first scrape after ms", lambda a: f"{a['first_scrape']:.1f}"),
        ("RSS MiB peak after release", lambda a: f"{a['peak_rss_after']:.1f}"),
        ("RSS MiB 4 s after release", lambda a: f"{a['rss_after']:.1f}"),
    )
    print(f"{'':<30}" + "".join(f"{n:<30}" for n in names))
    for label, fmt in rows:
        print(f"{label:<30}" + "".join(f"{fmt(results[n]['attack']):<30}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
