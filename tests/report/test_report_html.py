"""The HTML report opened in a real headless Chromium (Debian `chromium`, `chromium-driver`),
driven through chromedriver's W3C WebDriver API over HTTP: it renders its sections and plots, is
one file (no resource loaded: the browser's resource timing is empty, and a proxy that would see
any request sees none), and runs no script of its own."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockstep.report import html
from tests.support import free_port, require_real, wait_until
from tests.support.reports import sample_report

pytestmark = pytest.mark.real

CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium")


def call(url: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["value"]


class Sink:
    """A proxy nobody should call: counts the connections made to it."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.requests: list[str] = []  # the first line each asked
        self.thread = threading.Thread(target=self.accept, daemon=True)
        self.thread.start()

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            conn.settimeout(2)
            try:
                self.requests.append(conn.recv(200).decode(errors="replace").split("\r\n")[0])
            except OSError:
                self.requests.append("")
            conn.close()

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[tuple[str, Sink]]:
    require_real("Chromium and chromedriver (Debian chromium, chromium-driver)", bool(CHROMEDRIVER and CHROMIUM))
    port = free_port()
    driver = subprocess.Popen(
        [CHROMEDRIVER, f"--port={port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # type: ignore[list-item]
    )
    sink = Sink()
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return bool(call(f"{base}/status")["ready"])
            except OSError:
                return False

        wait_until(up, timeout=30, what="chromedriver")
        options = {
            "binary": CHROMIUM,
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'profile'}",
                f"--proxy-server=http://127.0.0.1:{sink.port}",
                "--proxy-bypass-list=<-loopback>",
                "--window-size=1200,900",
                # The browser's own traffic (updates, safe browsing, ...) is none of the page's.
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-default-apps",
                "--disable-domain-reliability",
            ],
        }
        session = call(f"{base}/session", "POST", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}})[
            "sessionId"
        ]
        yield f"{base}/session/{session}", sink
        call(f"{base}/session/{session}", "DELETE")
    finally:
        sink.close()
        driver.terminate()
        driver.wait(30)


MEASURE = """
return {
  title: document.title,
  verdict: document.getElementById('verdict').textContent,
  headings: Array.from(document.querySelectorAll('h2')).map(h => h.textContent),
  plots: Array.from(document.querySelectorAll('svg')).map(s => {
      const box = s.getBoundingClientRect();
      return [s.getAttribute('aria-label'), Math.round(box.width), Math.round(box.height),
              s.querySelector('polyline').getAttribute('points').split(' ').length];
  }),
  resources: performance.getEntriesByType('resource').map(r => r.name),
  scripts: document.scripts.length,
  loaders: document.querySelectorAll('[src], link, image, use, iframe, object, embed, [style*="url("]').length,
  grafana: document.getElementById('grafana').getAttribute('href'),
  rows: document.querySelectorAll('table tr').length,
};
"""


def test_the_html_report_renders_in_a_headless_browser_from_one_file(browser: tuple[str, Sink], tmp_path: Path) -> None:
    session, sink = browser
    report = sample_report()
    page = tmp_path / "report.html"
    page.write_text(html.render(report))
    before = sink.connections
    call(f"{session}/url", "POST", {"url": page.as_uri()})
    seen = call(f"{session}/execute/sync", "POST", {"script": MEASURE, "args": []})
    assert seen["title"] == "Lockstep report: job 4242"
    assert seen["verdict"] == report.verdict
    assert seen["headings"] == [
        "Job",
        "GPUs",
        "Steps",
        "Stragglers",
        "Checkpoints",
        "Hangs",
        "Alerts during the job",
        "Fabric and filesystem events",
        "Notes",
    ]
    # The step-time and throughput plots, drawn at their size (720 x 160 and a 1-px border), one
    # vertex per point.
    assert seen["plots"] == [["step time", 722, 162, 8], ["throughput", 722, 162, 5]]
    # Nothing asked for by the page: no element that loads anything, its resource timing empty,
    # and nothing through the proxy for the one address it names (the browser's own calls home,
    # updates and its search engine's preconnect, go through the proxy too: not the page's).
    page_requests = [r for r in sink.requests[before:] if "grafana.example.com" in r]
    assert (seen["loaders"], seen["resources"], seen["scripts"], page_requests) == (0, [], 0, [])
    assert seen["grafana"] == report.grafana_url
    assert seen["rows"] == 2 + 4 + 2  # the job's table, three GPUs, one checkpoint root (with headers)
