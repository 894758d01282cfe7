"""session/_login_notice.py: what a client is told of a server waiting for a login, as a table."""

from __future__ import annotations

from typing import Any

import pytest

from mcpool.session._login_notice import (
    LoginNotice,
    login_notice,
    may_log,
    takes_url_elicitation,
)

URL = {"elicitation": {"form": {}, "url": {}}}  # Claude Code, Codex, Copilot CLI
FORM = {"elicitation": {}}  # 2025-06-18: form mode only
NONE: dict[str, Any] = {}


@pytest.mark.parametrize(
    ("modern", "caps", "level", "told", "failed", "expected"),
    [
        (False, URL, None, False, False, LoginNotice.ELICIT_URL),
        (False, URL, "error", False, False, LoginNotice.ELICIT_URL),  # not a log message
        (False, FORM, None, False, False, LoginNotice.LOG),
        (False, NONE, None, False, False, LoginNotice.LOG),
        (False, NONE, "warning", False, False, LoginNotice.LOG),
        (False, NONE, "error", False, False, LoginNotice.NONE),  # asked for less
        (False, URL, None, True, False, LoginNotice.NONE),  # once per session
        (False, NONE, None, True, False, LoginNotice.NONE),
        (False, URL, None, True, True, LoginNotice.LOG),  # declined: the warning follows
        (False, URL, "critical", True, True, LoginNotice.NONE),
        (True, URL, None, False, False, LoginNotice.NONE),  # 2026: no request, no level
        (True, URL, "info", False, False, LoginNotice.LOG),
        (True, NONE, "debug", False, False, LoginNotice.LOG),
    ],
)
def test_login_notice(
    modern: bool,
    caps: dict[str, Any],
    level: str | None,
    told: bool,
    failed: bool,
    expected: LoginNotice,
) -> None:
    got = login_notice(
        modern=modern, capabilities=caps, log_level=level, told=told, elicitation_failed=failed
    )
    assert got is expected


@pytest.mark.parametrize(
    ("caps", "url"),
    [(URL, True), (FORM, False), (NONE, False), ({"elicitation": {"url": True}}, False)],
)
def test_url_mode_is_declared_by_an_object(caps: dict[str, Any], url: bool) -> None:
    assert takes_url_elicitation(caps) is url


def test_may_log() -> None:
    assert may_log(modern=False, log_level=None)
    assert not may_log(modern=True, log_level=None)
    assert may_log(modern=True, log_level="warning")
    assert not may_log(modern=False, log_level="error")
