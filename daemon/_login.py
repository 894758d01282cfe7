"""OAuth logins (issue 16): the daemon's admin handlers and the `daemonctl login/logout` commands.

The daemon side (`Logins`) owns the pool layer's OAuth `Broker` and a nursery for logins in
progress. A login is two admin requests, so that the user's side (daemonctl, which has the
display and the browser) sits between them: `login` starts the flow and answers with the
authorization URL as soon as the flow has one; `loginWait` answers once the redirect came back
and the tokens are stored (or with the error, naming the step). Once a server is authorized,
its entries reconnect, and their sessions get its tools by list_changed. The daemon never opens
a browser: `daemonctl login` does, with Python's `webbrowser` (which honours `$BROWSER`).

The browser is never started with the authorization URL (X7): a command line is readable by
every local user (`ps`), and the URL carries the login's state and PKCE challenge. It is
started with the login's loopback listener, `http://127.0.0.1:PORT/`, which redirects the
user's own uid to the URL and closes any other uid's connection unread (pool/_oauth.py). Unlike
a redirect file, that works with confined browsers (snap, flatpak), which cannot read the
private folders such a file must be in. daemonctl prints the URL itself on its own terminal,
for `--no-browser` and for a browser that did not start.

The daemon's answers never carry a token: a login's result is the server, whether it is
authorized, and the granted scope.
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from mcpool.pool import Pool, identity_of
from mcpool.pool._oauth import LOGIN_TIMEOUT, Broker, OAuthError, install, login_failure
from mcpool.pool._tokens import TokenStore
from mcpool.protocol import INVALID_PARAMS, McpoolError
from mcpool.session._login_notice import LoginStarted

from . import _paths
from ._settings import LoadedFile, settings_base_dir

if TYPE_CHECKING:
    from mcpool.pool import PoolEntry, TransportIdentity

# `login` answers once the flow has its authorization URL: discovery and registration are a
# few requests to the servers, each bounded by the flow's own request timeout.
URL_WAIT = 60.0
# daemonctl waits for `loginWait` a little longer than the daemon waits for the browser.
WAIT_SLACK = 30.0


class _Running:
    """One login in progress, as the two admin requests see it."""

    def __init__(self, identity: TransportIdentity) -> None:
        self.identity = identity
        self.url: str | None = None
        self.start_url: str | None = None  # what the browser is started with
        self.has_url = trio.Event()
        self.done = trio.Event()
        self.result: dict[str, Any] | None = None
        self.error: McpoolError | None = None

    def got_url(self, url: str, start_url: str) -> None:
        self.url = url
        self.start_url = start_url
        self.has_url.set()


class _SessionLogin:
    """A login started for a session (`Logins.start`)."""

    def __init__(self, url: str, running: _Running) -> None:
        self.url = url
        self._running = running

    async def finished(self) -> bool:
        with trio.move_on_after(LOGIN_TIMEOUT + WAIT_SLACK / 2):
            await self._running.done.wait()
        return self._running.result is not None and self._running.error is None


class SettingsRead(Protocol):
    """Which settings the daemon has read: where a login looks a server up by name."""

    config_path: str
    files: dict[str, LoadedFile]


class AdminCalls(Protocol):
    """What the daemonctl commands need of their admin connection (daemon/_ctl.py)."""

    path: str

    def call(self, command: str, params: dict[str, Any]) -> Any: ...


class Logins:
    """Made once the pool exists (`Daemon.run`), before any server starts: it installs the
    broker every HTTP upstream's OAuth goes through."""

    def __init__(self, pool: Pool, settings: SettingsRead, log: Callable[..., None]) -> None:
        self._pool = pool
        self._settings = settings
        self.broker = Broker(TokenStore(_paths.state_dir() / "oauth"), log=log)
        self.broker.on_authorized = self._reconnect
        install(self.broker)  # before any session can start an HTTP upstream
        self._nursery: trio.Nursery | None = None
        self._running: dict[str, _Running] = {}

    async def run(self) -> None:
        """The nursery logins run in, for the daemon's life."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await trio.sleep_forever()
        finally:
            install(None)

    # -- which server a NAME means -------------------------------------------------------------

    def identity(self, name: str) -> TransportIdentity:
        """The entry of that name that waits for a login, else any entry of it, else the
        server of that name in the settings files the daemon has read."""
        entries = [e for e in self._pool.entries() if e.name == name]
        for entry in entries:
            if self.shown_state(entry) == "needs-login":
                return entry.identity
        for entry in entries:
            if Broker.key_of(entry.identity) is not None:
                return entry.identity
        config = self._settings.config_path
        files = self._settings.files
        for path, loaded in sorted(files.items(), key=lambda kv: kv[0] != config):
            settings = loaded.servers.get(name)
            if settings is None:
                continue
            identity = identity_of(
                name, settings, base_dir=settings_base_dir(path, config), tables=self._pool.tables
            )
            if Broker.key_of(identity) is None:
                raise McpoolError(
                    f"server '{name}' does not use OAuth (stdio, an Authorization header, or "
                    "oauth.enabled false)",
                    message=f"No OAuth for {name}",
                    code=INVALID_PARAMS,
                    server=name,
                )
            return identity
        raise McpoolError(
            f"no server is named {name!r}", message=f"Unknown server {name}", code=INVALID_PARAMS
        )

    def shown_state(self, entry: PoolEntry) -> str:
        """The state `daemonctl servers` shows: needs-login also for a live connection one of
        whose operations wants a new login (a step-up)."""
        return self.broker.shown_state(entry.identity) or entry.state.value

    def _reconnect(self, key: str) -> None:
        for entry in self._pool.entries():
            if Broker.key_of(entry.identity) == key:
                self._pool.restart_entry(entry)

    # -- admin requests ------------------------------------------------------------------------

    async def login(self, name: str) -> dict[str, Any]:
        identity = self.identity(name)
        key = Broker.key_of(identity)
        assert key is not None
        assert self._nursery is not None
        running = self._running.get(key)
        if running is None or running.done.is_set():
            running = self._running[key] = _Running(identity)
            self._nursery.start_soon(self._login, running)
        with trio.move_on_after(URL_WAIT):
            async with trio.open_nursery() as race:

                async def first(event: trio.Event) -> None:
                    await event.wait()
                    race.cancel_scope.cancel()

                race.start_soon(first, running.has_url)
                race.start_soon(first, running.done)
        if running.error is not None:
            raise running.error
        if running.url is None and running.result is None:
            raise OAuthError(name, "discovery", f"no authorization URL within {URL_WAIT:g} s")
        return {
            "server": name,
            "url": running.url,
            "open": running.start_url,
            "done": running.done.is_set(),
        }

    async def start(self, server: str) -> LoginStarted:
        """A login for a session's client (session/_login_notice.py LoginDesk): started as
        `daemonctl login` starts one (or the one running joined), its loopback start page
        the client's to open."""
        answer = await self.login(server)
        running = self._running[Broker.key_of(self.identity(server)) or ""]
        if answer["open"] is None:  # authorized meanwhile: nothing to open
            raise OAuthError(server, "authorization", "the server is authorized already")
        return _SessionLogin(str(answer["open"]), running)

    async def _login(self, running: _Running) -> None:
        try:
            running.result = await self.broker.login(running.identity, running.got_url)
        except Exception as exc:  # a login's failure is its caller's, never the daemon's
            running.error = login_failure(running.identity.name, exc)
        finally:
            running.done.set()

    async def login_wait(self, name: str) -> dict[str, Any]:
        identity = self.identity(name)
        running = self._running.get(Broker.key_of(identity) or "")
        if running is None:
            raise McpoolError(
                f"no login of {name!r} is running", message="No login", code=INVALID_PARAMS
            )
        with trio.move_on_after(LOGIN_TIMEOUT + WAIT_SLACK / 2):
            await running.done.wait()
        if running.error is not None:
            raise running.error
        if running.result is None:
            raise OAuthError(name, "authorization", "the login is still running")
        return running.result

    async def logout(self, name: str) -> dict[str, Any]:
        identity = self.identity(name)
        return {"server": name, "removed": self.broker.logout(identity)}


# -- daemonctl login / logout ----------------------------------------------------------------


def add_commands(add: Any) -> None:
    """The two commands' arguments (daemonctl's parser calls this)."""
    login = add("login", "authorize an OAuth server in your browser, once for every session")
    login.add_argument("name", metavar="NAME")
    login.add_argument(
        "--no-browser", action="store_true", help="print the URL only; open it yourself"
    )
    logout = add("logout", "forget an OAuth server's tokens")
    logout.add_argument("name", metavar="NAME")


def cmd_login(client: AdminCalls, args: argparse.Namespace, as_json: bool) -> int:
    from ._ctl import EXIT_FAILED, EXIT_OK, AdminClient, _print_json, progress

    started = client.call("login", {"name": args.name})
    url = started.get("url")
    start_url = started.get("open")
    opened = False
    if isinstance(url, str) and not started.get("done"):
        sys.stderr.write(f"Open this URL to authorize {args.name}:\n  {url}\n")
        sys.stderr.flush()
        if not args.no_browser:
            # Never the URL itself on a command line (X7): the listener's address, which
            # redirects us to it. A daemon that has none: the user opens the URL.
            try:
                opened = isinstance(start_url, str) and webbrowser.open(start_url)
            except webbrowser.Error:
                opened = False
            if not opened:
                sys.stderr.write("(no browser could be started: open the URL yourself)\n")
    waiter = AdminClient(client.path, timeout=LOGIN_TIMEOUT + WAIT_SLACK)
    try:
        with progress(f"waiting for the authorization of {args.name}", as_json):
            result = waiter.call("loginWait", {"name": args.name})
    finally:
        waiter.close()
    result = {**result, "browser": opened}
    if as_json:
        _print_json(result)
    else:
        scope = result.get("scope")
        sys.stdout.write(f"{args.name}: authorized{f' (scope {scope})' if scope else ''}\n")
    return EXIT_OK if result.get("authorized") else EXIT_FAILED


def cmd_logout(client: AdminCalls, args: argparse.Namespace, as_json: bool) -> int:
    from ._ctl import EXIT_OK, _print_json

    result = client.call("logout", {"name": args.name})
    if as_json:
        _print_json(result)
    else:
        what = "logged out" if result.get("removed") else "had no stored login"
        sys.stdout.write(f"{args.name}: {what}\n")
    return EXIT_OK
