"""The README is a user's page (issue 27 item 6, issue 28): short, and with a section for each
client `mcpool setup-client` sets up, saying how to point it at mcpool and what it does through
it (list_changed, tool search, elicitation)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mcpool.daemon._setup import CLIENTS

README = Path(__file__).parent.parent / "README.md"
# The clients the real-client tests run (tests/e2e/test_real_clients.py): their sections say
# what was seen, tool search included.
RUN_BY_THE_TESTS = {"claude-code", "codex", "gemini", "qwen", "copilot", "opencode", "cline"}


def _sections() -> dict[str, str]:
    """Client key (the name in a `### Title (..., `key`)` heading) -> its section's text."""
    text = README.read_text()
    found: dict[str, str] = {}
    for match in re.finditer(r"^### ([^\n]+)\n(.*?)(?=^#{2,3} )", text, re.M | re.S):
        key = re.search(r"`([a-z-]+)`\)$", match.group(1))
        if key:
            found[key.group(1)] = match.group(2)
    return found


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 400


@pytest.mark.parametrize("client", CLIENTS)
def test_each_client_has_a_section(client: str) -> None:
    section = _sections().get(client)
    assert section is not None, f"README has no `### ... ({client})` section"
    assert "list_changed" in section
    assert "elicitation" in section.lower()
    assert "/path/to/mcpool" in section or "setup-client" in section
    if client in RUN_BY_THE_TESTS:
        assert "tool search" in section.lower(), section
