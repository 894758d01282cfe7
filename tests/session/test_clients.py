"""The client table (session/_clients.py) against what the real clients did
(tests/e2e/test_real_clients.py's matrix: which re-listed after list_changed)."""

from __future__ import annotations

import math

import pytest

from mcpool.session._clients import first_list_wait, lists_once


@pytest.mark.parametrize(
    ("client_name", "once"),
    [
        ("claude-code", False),  # Claude Code 2.1.332
        ("codex-mcp-client", True),  # Codex 0.171.0
        ("gemini-cli-mcp-client", False),  # gemini-cli 0.61.0
        ("qwen-cli-mcp-client-mcpool", True),  # Qwen Code 0.24.4
        ("copilot-cli", False),  # Copilot CLI 1.0.102
        ("opencode", False),  # opencode 1.18.33
        ("@cline/core", True),  # Cline CLI 3.0.65
        ("some-editor", False),
        (None, False),
    ],
)
def test_which_clients_list_once(client_name: str | None, once: bool) -> None:
    assert lists_once(client_name) is once


def test_the_daemon_option_names_more_clients() -> None:
    assert lists_once("My-Agent 2", ["my-agent"])
    assert not lists_once("My-Agent 2", ["other", ""])


@pytest.mark.parametrize(
    ("lists_once_", "known_slow", "expected"),
    [
        (False, False, 11.5),  # the startup budget
        (True, False, 18.0),  # since + the list-once budget, past the startup deadline
        (True, True, -math.inf),  # remembered slow: not waited for
        (False, True, -math.inf),
    ],
)
def test_first_list_wait(lists_once_: bool, known_slow: bool, expected: float) -> None:
    assert (
        first_list_wait(
            startup_deadline=11.5,
            since=10.0,
            list_once_budget=8.0,
            lists_once=lists_once_,
            known_slow=known_slow,
        )
        == expected
    )
