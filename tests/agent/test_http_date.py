"""The HTTP Date header (lockstep/agent/server.py http_date) as email.utils.formatdate writes it,
which it replaces on the scrape path (issue 47)."""

from __future__ import annotations

import email.utils
import random

from lockstep.agent.server import http_date


def test_the_date_header_is_email_utils_formatdate() -> None:
    moments = [0.0, 951782400.0, 1795950000.7, 4102444799.0, *(random.Random(7).uniform(0, 4e9) for _ in range(2000))]
    assert [http_date(t) for t in moments] == [email.utils.formatdate(t, usegmt=True) for t in moments]
    assert http_date(951782400.0) == "Tue, 29 Feb 2000 00:00:00 GMT"
