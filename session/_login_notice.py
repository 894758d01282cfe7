"""How a session tells its client that a server waits for the user's OAuth login (issue 28).

Decided here, done by the session: a client that declared URL-mode elicitation (2025-11-25:
`capabilities.elicitation.url`) in the handshake era is asked to open the login's start page on
the daemon's loopback listener, the same page `daemonctl login` opens, so the login completes
without a terminal; any other client gets a warning log message naming `daemonctl login NAME`,
as far as its era and log level let a server log. Each server is told once per session, but an
elicitation the client declined or could not show falls back to the warning.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Protocol

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


# How long a session waits for its client's answer to the login elicitation, and then for the
# login itself (the user is in the browser): the OAuth flow's own bound, pool/_oauth.py.
ANSWER_TIMEOUT = 300.0


class LoginStarted(Protocol):
    """A login the daemon started for a session's client."""

    @property
    def url(self) -> str:
        """The page that starts it: the login's loopback listener, which redirects only the
        user's own uid to the authorization URL (the URL itself never leaves the daemon)."""
        ...

    async def finished(self) -> bool:
        """Once the login is over (bounded): whether the server is now authorized."""
        ...


class LoginDesk(Protocol):
    """What a session is given to start a server's login for its client (the daemon's
    `Logins`); raises `McpoolError` naming the server and the step when it cannot."""

    async def start(self, server: str) -> LoginStarted: ...


class LoginNotice(enum.Enum):
    NONE = "none"  # nothing can be said (or it was said)
    LOG = "log"  # a notifications/message warning
    ELICIT_URL = "elicit-url"  # an elicitation/create in URL mode, with the login's start page


def login_needed_text(server: str) -> str:
    return (
        f"server '{server}' needs you to log in before its tools can be listed or called: "
        f"run `daemonctl login {server}`"
    )


def elicitation_text(server: str) -> str:
    return (
        f"Server '{server}' needs you to log in (OAuth) before its tools can be used. Open the "
        "page to log in in your browser; its tools follow once you have."
    )


def elicitation_params(server: str, url: str, elicitation_id: str) -> dict[str, Any]:
    return {
        "mode": "url",
        "message": elicitation_text(server),
        "url": url,
        "elicitationId": elicitation_id,
    }


def accepted(result: Any) -> bool:
    """A client's answer to the elicitation: did the user agree to open the page?"""
    return isinstance(result, dict) and result.get("action") == "accept"


def takes_url_elicitation(capabilities: Mapping[str, Any]) -> bool:
    """Did the client declare URL-mode elicitation? (`{}` alone means form mode only.)"""
    elicitation = capabilities.get("elicitation")
    return isinstance(elicitation, dict) and isinstance(elicitation.get("url"), dict)


def may_log(*, modern: bool, log_level: str | None, level: str = "warning") -> bool:
    """May the server side send a log message of `level` now? At 2026-07-28 only once a
    request asked for a level; before it, unless the client set a level above this one."""
    if log_level is None:
        return not modern
    return LOG_LEVELS.index(level) >= LOG_LEVELS.index(log_level)


def login_notice(
    *,
    modern: bool,
    capabilities: Mapping[str, Any],
    log_level: str | None,
    told: bool,
    elicitation_failed: bool = False,
) -> LoginNotice:
    """What to send a session's client for a server that needs a login. `told`: this server
    was told to this session already; `elicitation_failed`: the elicitation for it was
    declined, cancelled or refused (the warning follows instead)."""
    if told and not elicitation_failed:
        return LoginNotice.NONE
    # At 2026-07-28 a server may ask the client only within a request it is answering (MRTR):
    # there is no request here, so a modern session gets the log message.
    if not modern and not elicitation_failed and takes_url_elicitation(capabilities):
        return LoginNotice.ELICIT_URL
    if may_log(modern=modern, log_level=log_level):
        return LoginNotice.LOG
    return LoginNotice.NONE
