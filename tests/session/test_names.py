"""Exposed-name budgets: names that fit each client after its own prefix (issue 13, point 3)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpool.session import MAX_NAME, exposed_name
from mcpool.session._names import (
    MIN_NAME,
    client_budget,
    name_budget,
    seen_as,
    user_name_forms,
)

SERVER_41 = "atlassian-confluence-enterprise-workspace"  # 41 characters, as in the issue


def test_client_budgets_leave_room_for_each_clients_prefix() -> None:
    assert client_budget("claude-code") == 64 - len("mcp__mcpool__")
    assert client_budget("qwen-code-mcp-client") == 63 - len("mcp__mcpool__")
    assert client_budget("gemini-cli-mcp-client") == 63 - len("mcp_mcpool_")
    assert client_budget("codex-mcp-client") == 64 - len("mcpool__")
    assert client_budget("copilot-cli") == 64 - len("mcpool-")
    assert client_budget("opencode") == 64 - len("mcpool_")
    assert client_budget("@cline/core") == 64 - len("mcpool__")
    assert client_budget("some-editor") is None
    assert client_budget(None) is None


def test_explicit_budget_wins_then_the_daemon_option_then_the_client() -> None:
    assert name_budget("claude-code") == 51
    assert name_budget("claude-code", configured=40) == 40
    assert name_budget("claude-code", explicit=30, configured=40) == 30
    assert name_budget("unknown") == MAX_NAME
    # Out of range values are held to what still makes a readable, unique name.
    assert name_budget(None, explicit=3) == MIN_NAME
    assert name_budget(None, explicit=500) == MAX_NAME


def test_a_long_server_name_keeps_the_tool_name_whole() -> None:
    budget = name_budget("claude-code")
    name = exposed_name(SERVER_41, "write_file", budget=budget)
    assert len(name) <= budget
    assert name.endswith("__write_file")
    assert len("mcp__mcpool__" + name) <= 64
    assert name == exposed_name(SERVER_41, "write_file", budget=budget)  # deterministic


# 52 characters (issue 28): `<server>__echo` fits 64, not 64 after any client's own prefix.
SERVER_52 = "atlassian-confluence-enterprise-workspace-eu-west-1a"


@pytest.mark.parametrize(
    ("client_name", "prefix", "limit"),
    [
        ("copilot-cli", "mcpool-", 64),  # GitHub Copilot CLI 1.0.102
        ("opencode", "mcpool_", 64),  # opencode 1.18.33
        ("@cline/core", "mcpool__", 64),  # Cline CLI 3.0.65
    ],
)
def test_a_52_character_server_fits_each_new_client_after_its_prefix(
    client_name: str, prefix: str, limit: int
) -> None:
    assert len(SERVER_52) == 52
    assert len(prefix + f"{SERVER_52}__echo") > limit  # what the client sent without a rule
    budget = name_budget(client_name)
    for tool in ("echo", "env", "whoami", "write_file"):
        name = exposed_name(SERVER_52, tool, budget=budget)
        assert len(prefix + name) <= limit, name
        assert name.endswith(f"__{tool}")  # the model still reads the tool's own name


def test_names_within_budget_are_untouched() -> None:
    assert exposed_name("fs", "read_file", budget=MIN_NAME) == "fs__read_file"


@given(
    server=st.text(min_size=1, max_size=60),
    names=st.lists(st.text(min_size=1, max_size=90), min_size=2, max_size=6, unique=True),
    budget=st.integers(min_value=MIN_NAME, max_value=MAX_NAME),
)
def test_shortened_names_fit_the_budget_and_stay_distinct(
    server: str, names: list[str], budget: int
) -> None:
    exposed = [exposed_name(server, n, budget=budget) for n in names]
    for e in exposed:
        assert len(e) <= budget
        assert re.fullmatch(r"[A-Za-z0-9_-]+", e)
    # Distinct upstream names whose sanitised forms differ, or that were shortened, never meet.
    sanitised = [re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{n}") for n in names]
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            if sanitised[i] != sanitised[j] or len(sanitised[i]) > budget:
                assert exposed[i] != exposed[j]


def test_names_users_see_in_clients_lead_back_to_the_exposed_name() -> None:
    exposed = "files__write_file"
    for seen in (
        "files__write_file",
        "mcp__mcpool__files__write_file",  # Claude Code, Qwen Code
        "mcp_mcpool_files__write_file",  # gemini-cli
        "mcpool__files__write_file",  # Codex
        "mcp__my_pool__files__write_file",  # a client that calls mcpool something else
        "mcpool-files__write_file",  # Copilot CLI
        "mcpool_files__write_file",  # opencode
    ):
        assert seen_as(user_name_forms(seen), exposed), seen
    # Codex folds `-` to `_`: the exposed name with a dash is still found.
    assert seen_as(user_name_forms("mcpool__my_files__write_file"), "my-files__write_file")
    assert not seen_as(user_name_forms("mcp__mcpool__files__read_file"), exposed)
