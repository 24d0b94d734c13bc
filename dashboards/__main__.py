"""Render the dashboards: `python -m dashboards --write` writes them, `--check` says whether they are current."""

from __future__ import annotations

import sys

from alerts.generated import Generator, main
from dashboards.render import render_all

DASHBOARDS = Generator(
    prog="python -m dashboards",
    description=__doc__,
    files="the generated dashboards and ConfigMaps",
    render_all=render_all,
    # A dashboard that was renamed or removed leaves its old JSON behind: that is stale too.
    owned=("dashboards/*.json",),
)

if __name__ == "__main__":
    sys.exit(main(DASHBOARDS))
