"""One InfiniBand collection round of ours vs a node_exporter scrape, on the same tree of 8 HCAs.

    .venv/bin/python bench/infiniband.py [--rounds 300] [--hcas 8]

Generates a sysfs tree of mlx5 HCAs (one port each: 21 PMA counters, 29 hw_counters and
lifespan; simulation/fabric.py), then, alternating so both see the same machine noise:
- ours: one ``InfinibandCollector.collect()`` round, families built (what the agent does each
  interval; a scrape then serves the snapshot without touching sysfs);
- ours + render: the same round plus rendering the text exposition;
- ours, PMA only: a round on a copy of the tree without hw_counters/, i.e. the files
  node_exporter 1.5.0 reads (it does not read hw_counters/), for the cost per file;
- node_exporter (Debian ``prometheus-node-exporter``, its own instance on a free port, only the
  infiniband collector, --path.sysfs at the same tree): one scrape of /metrics over a
  keep-alive connection (node_exporter reads sysfs on every scrape).
Prints p50/p99 of each and the ratios.  No assertion: the machines are shared and noisy.
Target (issue 4): ours is not slower.
"""

from __future__ import annotations

import argparse
import http.client
import logging
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.collectors.infiniband import InfinibandCollector, InfinibandOptions
from lockstep.simulation.fabric import bench_tree


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_node_exporter(sysfs: Path, port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        sys.exit("node_exporter not found: apt-get install prometheus-node-exporter (dev/debian-packages.d/fabric.txt)")
    process = subprocess.Popen(
        [binary, f"--path.sysfs={sysfs}", "--collector.disable-defaults", "--collector.infiniband",
         "--web.disable-exporter-metrics", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            if process.poll() is not None:
                sys.exit(f"node_exporter exited: {process.stderr.read().decode() if process.stderr else ''}")
            time.sleep(0.05)
    process.kill()
    sys.exit("node_exporter did not start listening within 10 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--hcas", type=int, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lockstep-bench-ib-") as tmp:
        paths = Paths(sysfs=Path(tmp) / "sys")
        bench_tree(paths, args.hcas)
        files = sum(1 for p in paths.sysfs.rglob("*") if p.is_file())
        collector = InfinibandCollector(CollectorContext(paths, InfinibandOptions(), logging.getLogger("bench")))
        pma_paths = Paths(sysfs=Path(tmp) / "pma-only" / "sys")
        shutil.copytree(paths.sysfs, pma_paths.sysfs)
        for directory in pma_paths.sysfs.glob("class/infiniband/*/ports/*/hw_counters"):
            shutil.rmtree(directory)
        pma_only = InfinibandCollector(CollectorContext(pma_paths, InfinibandOptions(), logging.getLogger("bench")))
        list(pma_only.collect())
        registry = CollectorRegistry()

        class Round:
            def collect(self):  # type: ignore[no-untyped-def]
                return collector.collect()

        registry.register(Round())
        ours_text = generate_latest(registry).decode()  # also warms the discovery cache

        port = free_port()
        node_exporter = start_node_exporter(paths.sysfs, port)
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

            def scrape() -> str:
                connection.request("GET", "/metrics")
                response = connection.getresponse()
                body = response.read()
                assert response.status == 200, response.status
                return body.decode()

            theirs_text = scrape()
            ours, ours_rendered, ours_pma, theirs = [], [], [], []
            for _ in range(args.rounds):
                started = time.perf_counter()
                for _family in collector.collect():
                    pass
                ours.append(time.perf_counter() - started)
                started = time.perf_counter()
                generate_latest(registry)
                ours_rendered.append(time.perf_counter() - started)
                started = time.perf_counter()
                for _family in pma_only.collect():
                    pass
                ours_pma.append(time.perf_counter() - started)
                started = time.perf_counter()
                scrape()
                theirs.append(time.perf_counter() - started)
        finally:
            node_exporter.terminate()
            node_exporter.wait(10)

    def series(text: str, prefix: str) -> int:
        return sum(len(f.samples) for f in text_string_to_metric_families(text) if f.name.startswith(prefix))

    def transmitted(text: str, name: str) -> float:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels.get("device") == "mlx5_0":
                    return sample.value
        return float("nan")

    print(f"tree: {args.hcas} mlx5 HCAs, 1 port each, {files} files; {args.rounds} rounds, alternating")
    print(f"series: ours {series(ours_text, 'lockstep_')}, node_exporter {series(theirs_text, 'node_infiniband')}")
    print(
        "mlx5_0 bytes transmitted: ours "
        f"{transmitted(ours_text, 'lockstep_ib_port_transmitted_bytes_total'):.0f}, node_exporter "
        f"{transmitted(theirs_text, 'node_infiniband_port_data_transmitted_bytes_total'):.0f}"
    )
    rows = [("ours: collection round", ours), ("ours: round + text exposition", ours_rendered),
            ("ours: round, PMA only", ours_pma), ("node_exporter: scrape", theirs)]  # fmt: skip
    for label, values in rows:
        print(
            f"{label:32s} p50 {percentile(values, 0.5) * 1e3:6.2f} ms   p99 {percentile(values, 0.99) * 1e3:6.2f} ms"
            f"   mean {statistics.fmean(values) * 1e3:6.2f} ms"
        )
    for label, values in rows[:3]:
        print(
            f"ratio {label.removeprefix('ours: ')} / node_exporter scrape: "
            f"p50 {percentile(values, 0.5) / percentile(theirs, 0.5):.2f}, "
            f"p99 {percentile(values, 0.99) / percentile(theirs, 0.99):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
