"""OAuth 2.1 for HTTP and SSE upstreams, done once per user in the daemon (issue 16).

Theory of operation. What is the SDK's and what is ours:

- The protocol steps are the `mcp` SDK's `OAuthClientProvider` (an `httpx2.Auth` flow, the
  same HTTP client `_http` uses): protected resource metadata discovery (RFC 9728, the
  `resource_metadata` of `WWW-Authenticate`, then the path and root well-known URLs), the
  resource check (a PRM `resource` that is not this server is refused), authorization server
  metadata (RFC 8414 and OpenID Connect discovery in the spec's order; the 2025-03-26 root
  fallbacks), scope selection (challenge, then `scopes_supported`, omitted when undefined;
  `offline_access` when offered; the step-up union on 403 `insufficient_scope`), client ID
  metadata documents, dynamic client registration (RFC 7591), PKCE S256, `resource` (RFC 8707),
  the token request with `client_secret_basic` / `client_secret_post` / `none`, and refresh.
- Ours (`_Provider`, a subclass): the daemon never waits for a person inside a request. A
  connection's flow that would need one (register a client, open the authorization URL) stops
  with `NeedsLogin` instead; the entry shows `needs-login` and waits. `daemonctl login` runs the
  interactive half here (`Broker.login`): it feeds the flow the challenge the server last gave
  (or asks the server once), hands the authorization URL to daemonctl, which starts the user's
  browser at a loopback listener of the daemon that redirects it there (never with the URL on
  a command line), and takes the redirect on that listener, which serves only the daemon's uid
  and takes one callback with the login's state (X7, "the loopback redirect" below). Also
  ours: refresh on a 401 before any new login (the SDK goes straight to a new authorization),
  refresh a margin before expiry (and after a restart, from the stored expiry), the token
  endpoint method of pre-registered credentials chosen from what the server advertises, a
  bounded number of step-up logins, the token store (`_tokens`), and errors that name the
  server and the step in one line, whatever nursery groups they came through
  (`login_failure`).

Tokens are never logged or shown (X2): nothing here formats a token, and the SDK's own logger
(which logs flow errors with tracebacks) is silenced; what the user sees is our messages.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlsplit

import msgspec
import trio

from mcpool.protocol import LATEST_HANDSHAKE, McpoolError, UpstreamUnavailable

from ._oauth_settings import OAuthSettings, oauth_identity
from ._peercred import RefusalTally, peer_uid_off_loop
from ._spec import TransportIdentity, printable
from ._tokens import TokenRecord, TokenStore, token_key

if TYPE_CHECKING:
    import httpx2

# An access token is refreshed this long before the server says it expires (clock skew, and
# the time a request takes), or at half its lifetime when that is shorter.
REFRESH_MARGIN = 60.0
# The user has this long to finish in the browser after `daemonctl login` printed the URL.
LOGIN_TIMEOUT = 300.0
# A 403 insufficient_scope is answered with a new login at most this many times in a row for
# one server; then the server is refused until its settings change or the user logs out (a
# server that never accepts the scope it asks for must not loop the user through the browser).
MAX_STEP_UPS = 3
# The redirect's request head must arrive within this, whole (a local client that connects
# and says nothing, or dribbles, must not hold a connection slot).
CALLBACK_READ_TIMEOUT = 10.0
MAX_CALLBACK_HEAD = 16 * 1024  # a redirect's request line and headers; more is not one
# The owner lookup of a connection: sock_diag answers at once; the /proc fallback reads the TCP
# table in a worker thread.
PEER_CHECK_TIMEOUT = 5.0
# Connections whose owner is being looked up at once (only the /proc fallback takes time);
# more are closed unread.
MAX_UNCHECKED = 64
# Our own uid's connections read at once (a browser opens a few speculative ones, each bounded
# by CALLBACK_READ_TIMEOUT); more are closed.
MAX_OWNER_CONNECTIONS = 32
LISTEN_BACKLOG = 128
# An answer page is sent within this (it fits in the socket's buffer: only a peer that reads
# nothing can take long).
PAGE_TIMEOUT = 2.0
# Out of file descriptors or memory: accept again after this.
ACCEPT_RETRY = 0.1
_ACCEPT_LATER = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
# Discovery, registration and token requests, and the login's probe, are short exchanges.
OAUTH_REQUEST_TIMEOUT = 30.0
CALLBACK_PATH = "/callback"
START_PATH = "/"  # the browser is started here; it redirects to the authorization URL
CLIENT_NAME = "mcpool"

Step = Literal["discovery", "registration", "authorization", "token", "refresh"]

# The SDK logs every flow error with its traceback at ERROR; with no handler configured that
# reaches stderr through logging.lastResort. Our errors carry the same facts, named.
_sdk_log = logging.getLogger("mcp.client.auth")
_sdk_log.addHandler(logging.NullHandler())
_sdk_log.propagate = False


def oauth_settings_of(identity: TransportIdentity) -> OAuthSettings | None:
    text = getattr(identity, "oauth", None)
    return msgspec.json.decode(text, type=OAuthSettings) if text else None


class NeedsLogin(UpstreamUnavailable):
    """The server wants an authorization that only the user can give: `daemonctl login`."""

    default_message = "Upstream server needs a login"

    def __init__(
        self, server: str, *, step_up: bool = False, scope: str | None = None, spent: bool = False
    ) -> None:
        why = f"needs a new login for scope '{scope}'" if step_up and scope else "needs a login"
        todo = f"run `daemonctl login {server}`"
        if spent:  # the step-up bound is reached: another login would loop the user
            why = f"still answers insufficient_scope after {MAX_STEP_UPS} logins"
            todo = f"fix its settings, or `daemonctl logout {server}` to start over"
        super().__init__(
            server,
            f"server '{server}' {why}: {todo}",
            needs_login=True,
            step="authorization",
        )
        self.step_up = step_up


# How each step reads in an error: "server 'x': OAuth token request failed: ...".
STEP_TEXT: dict[str, str] = {
    "discovery": "discovery",
    "registration": "client registration",
    "authorization": "authorization",
    "token": "token request",
    "refresh": "token refresh",
}
# A server's error text quoted in ours is cut here (a token endpoint may answer a whole page).
MAX_DETAIL = 300


class OAuthError(UpstreamUnavailable):
    """A step of the OAuth flow failed: the server, the step and the server's error, in one
    line (the detail is made printable and bounded here, whoever wrote it)."""

    default_message = "Upstream server authorization failed"

    def __init__(self, server: str, step: Step, detail: str) -> None:
        text = f"server '{server}': OAuth {STEP_TEXT[step]} failed: {one_line(detail)}"
        super().__init__(server, text, step=step)
        self.step = step


def one_line(text: str, limit: int = MAX_DETAIL) -> str:
    """`text` as one printable line of at most `limit` characters."""
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def login_failure(server: str, exc: BaseException) -> McpoolError:
    """One error for a login that failed, whatever nursery groups it came out of: the first
    McpoolError among its causes (ours name the server and the step), else an OAuthError of the
    authorization step saying what the causes were. Never a group, never a repr."""
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, McpoolError):
            return leaf
    return OAuthError(server, "authorization", _detail(exc))


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside `exc`'s groups (itself when it is none), cancellations left out."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [] if isinstance(exc, trio.Cancelled) else [exc]


def choose_auth_method(advertised: list[str] | None, has_secret: bool) -> str:
    """The token endpoint authentication of a client with (or without) a secret, from what
    the authorization server advertises (RFC 8414: absent means client_secret_basic)."""
    if not has_secret:
        return "none"
    offered = advertised or ["client_secret_basic"]
    for method in ("client_secret_basic", "client_secret_post"):
        if method in offered:
            return method
    return "none" if "none" in offered else "client_secret_basic"


def parse_challenge(header: str | None) -> dict[str, str]:
    """The auth-params of a `WWW-Authenticate: Bearer k="v", ...` header (RFC 6750 §3)."""
    params: dict[str, str] = {}
    if not header:
        return params
    import re

    for m in re.finditer(r'([A-Za-z_][A-Za-z0-9_-]*)=(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))', header):
        params[m.group(1).lower()] = m.group(2) if m.group(2) is not None else m.group(3)
    return params


# -- the loopback redirect ------------------------------------------------------------------
#
# The listener a login takes its redirect on (RFC 8252 §7.3) is one login's alone (X7):
#
# - It serves only the daemon's own uid. Every accepted connection's owner is looked up (the
#   kernel's, `_peercred`) before a byte is read; another uid's is closed unread, and counted in
#   a log line at most once a minute per uid. Any local user can reach a loopback port, and
#   the authorization URL (state, PKCE challenge) can be guessed at or seen: a code another user
#   got for its own account, delivered here with our state, would otherwise log every session
#   in as that account, and an error delivered here would end our login.
# - It hands the browser the authorization URL at `/` (a redirect), so that daemonctl starts
#   the browser with `http://127.0.0.1:PORT/` on its command line instead of the URL, which any
#   local user can read in `ps`.
# - The state is single-use and this login's: `RedirectGate` takes the first callback with it
#   and refuses every other one (another state, the same state again, none) with an error
#   page, leaving the login waiting; only the owner's right callback completes it.
# - Each connection is its own task, bounded in bytes and in time, and so is their number: a
#   connection that says nothing or dribbles never holds up the browser's.


class CallbackResult(msgspec.Struct, frozen=True):
    code: str | None = None
    state: str | None = None
    iss: str | None = None
    error: str | None = None
    error_description: str | None = None


@dataclass(frozen=True)
class Answer:
    """What the listener answers one request with (`RedirectGate.judge`)."""

    status: int
    result: CallbackResult | None = None  # the redirect the login waits for
    location: str | None = None  # the start page: where the browser goes
    refused: str | None = None  # why a callback was refused, for the log


class RedirectGate:
    """One login's redirect: its authorization URL and its state, which one callback uses.
    Pure (no sockets): `judge` decides the answer to a request head."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.state: str | None = None  # until a callback used it
        self.spent: str | None = None  # the state, once used

    def issue(self, url: str) -> None:
        self.url = url
        self.state = parse_qs(urlsplit(url).query).get("state", [None])[0]
        self.spent = None

    def judge(self, head: bytes) -> Answer:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != "GET":
            return Answer(405)
        target = urlsplit(parts[1])
        if target.path == START_PATH and not target.query:
            if self.url is None or self.spent is not None:
                return Answer(410)  # no URL yet, or the authorization came back already
            return Answer(303, location=self.url)
        if target.path != CALLBACK_PATH:
            return Answer(404)
        query = {k: v[0] for k, v in parse_qs(target.query).items()}
        state = query.get("state")
        if state is None:
            return Answer(400, refused="a callback without a state")
        if self.spent is not None and secrets.compare_digest(state, self.spent):
            return Answer(400, refused="a callback whose state was already used")
        if self.state is None or not secrets.compare_digest(state, self.state):
            return Answer(400, refused="a callback with another login's state")
        result = CallbackResult(
            code=query.get("code"),
            state=state,
            iss=query.get("iss"),
            error=query.get("error"),
            error_description=query.get("error_description"),
        )
        if result.code is None and result.error is None:
            return Answer(400, refused="a callback with neither a code nor an error")
        self.spent, self.state = self.state, None
        return Answer(200, result=result)


_REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    410: "Gone",
}


def _page(answer: Answer, server: str) -> bytes:
    text = {
        200: f"mcpool: the authorization of {server} reached the daemon. You can close this tab.",
        400: "mcpool: this is not the authorization mcpool is waiting for.",
        410: "mcpool: this login is over; run `daemonctl login` again if you need one.",
    }.get(answer.status, "mcpool: not found.")
    body = b"" if answer.location else _html(text)
    extra = f"Location: {answer.location}\r\nReferrer-Policy: no-referrer\r\n"
    return (
        f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, 'Error')}\r\n"
        f"{extra if answer.location else ''}"
        "Content-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
    ).encode() + body


def _html(text: str) -> bytes:
    return f"<!doctype html><meta charset=utf-8><title>mcpool</title><p>{text}</p>\n".encode()


class CallbackListener:
    """The daemon's loopback listener for one login's redirect (127.0.0.1), serving only the
    daemon's uid."""

    def __init__(self, server: str, sock: trio.socket.SocketType, log: Callable[..., None]) -> None:
        self.server = server
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self.log = log
        self.owner = os.geteuid()
        self.gate = RedirectGate()
        self.refusals: RefusalTally[str, int] = RefusalTally()
        self._unchecked = 0  # connections whose owner is being looked up
        self._reading = 0  # our own uid's connections being read or answered
        self._send, self._receive = trio.open_memory_channel[CallbackResult](1)

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    @property
    def start_url(self) -> str:
        """What the browser is started with: it redirects our uid to the authorization URL."""
        return f"http://127.0.0.1:{self.port}{START_PATH}"

    @classmethod
    async def bind(
        cls, server: str, port: int, *, exact: bool, log: Callable[..., None]
    ) -> CallbackListener:
        """Listen on `port` (0: any). A port the settings name is the redirect URI the client
        was registered with: taken, it is an error; a remembered one is only a preference."""
        for candidate in (port, 0) if port and not exact else (port,):
            sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
            # The port of the last login may still have connections in TIME_WAIT.
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
            try:
                await sock.bind(("127.0.0.1", candidate))
                sock.listen(LISTEN_BACKLOG)
            except OSError as exc:
                sock.close()
                if candidate == 0 or exact:
                    raise OAuthError(
                        server, "authorization", f"cannot listen for the redirect: {exc}"
                    ) from exc
                continue
            return cls(server, sock, log)
        raise AssertionError("unreachable")  # pragma: no cover

    async def serve(self) -> None:
        """Accept until cancelled; never raises for what a peer does."""
        listener = trio.SocketListener(self.sock)
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_LATER:
                        raise
                    await trio.sleep(ACCEPT_RETRY)  # out of fds or memory: a moment
                    continue
                if self._unchecked >= MAX_UNCHECKED:
                    _drop(stream)  # only while lookups wait for the /proc fallback
                    continue
                self._unchecked += 1
                nursery.start_soon(self._one, stream)

    async def _one(self, stream: trio.SocketStream) -> None:
        checked = False
        try:
            uid = await self._peer_uid(stream)
            self._unchecked -= 1
            checked = True
            if uid != self.owner:
                self._refused(uid, "a connection from another user")
                return  # closed unread (finally)
            if self._reading >= MAX_OWNER_CONNECTIONS:
                self._refused(uid, "a connection past the listener's bound")
                return
            self._reading += 1
            try:
                await self._serve_owner(stream, uid)
            finally:
                self._reading -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the peer went away: only its connection ends
        finally:
            if not checked:
                self._unchecked -= 1
            _drop(stream)

    async def _peer_uid(self, stream: trio.SocketStream) -> int | None:
        """Who holds the other end (None: nobody the kernel knows, or not in time)."""
        peer = stream.socket.getpeername()
        local = stream.socket.getsockname()
        with trio.move_on_after(PEER_CHECK_TIMEOUT):
            return await peer_uid_off_loop((peer[0], peer[1]), (local[0], local[1]))
        return None

    async def _serve_owner(self, stream: trio.SocketStream, uid: int) -> None:
        head = b""
        # One deadline for the whole head: a peer that dribbles gets no more than one that
        # says nothing.
        with trio.move_on_after(CALLBACK_READ_TIMEOUT):
            while b"\r\n\r\n" not in head and len(head) < MAX_CALLBACK_HEAD:
                chunk = await stream.receive_some(MAX_CALLBACK_HEAD - len(head))
                if not chunk:
                    break
                head += chunk
        answer = self.gate.judge(head)
        if answer.refused is not None:
            self._refused(uid, answer.refused)
        if answer.result is not None:
            # The gate took this state (no other callback can be taken), so the login takes
            # it whatever becomes of this connection; the page is a courtesy to the browser,
            # sent even when the login ends meanwhile (a few hundred bytes: at once).
            self._send.send_nowait(answer.result)
        with trio.move_on_after(PAGE_TIMEOUT, shield=answer.result is not None):
            await stream.send_all(_page(answer, self.server))

    def _refused(self, uid: int | None, what: str) -> None:
        line = self.refusals.refused(what, uid, trio.current_time())
        if line is not None:
            self._log_refusal(uid, what, line.times)

    def _log_refusal(self, uid: int | None, what: str, count: int) -> None:
        self.log(
            "warning",
            f"server '{self.server}': the OAuth redirect listener refused {what}",
            server=self.server,
            uid=uid,
            count=count,
        )

    async def wait(self) -> CallbackResult:
        return await self._receive.receive()

    def close(self) -> None:
        for line in self.refusals.flush():
            self._log_refusal(line.peer, line.kind, line.times)
        self.sock.close()


def _drop(stream: trio.SocketStream) -> None:
    """Close at once, whatever is unread (the kernel answers a reset)."""
    stream.socket.close()


# -- the token storage the SDK provider reads and writes --------------------------------------


class _Storage:
    """The SDK's `TokenStorage` over our store, for one record key."""

    def __init__(
        self, store: TokenStore, key: str, preregistered: Any | None, *, login: bool
    ) -> None:
        self.store = store
        self.key = key
        self.preregistered = preregistered  # OAuthClientInformationFull from the settings
        # Only a login records a client: a connection that found the server's client ID
        # metadata document support on its way to needs-login must not write a record back
        # (after a logout, that would be a record the user just removed).
        self.login = login

    async def get_tokens(self) -> Any:
        from mcp.shared.auth import OAuthToken

        tokens = self.store.load(self.key).tokens
        if not tokens:
            return None
        try:
            return OAuthToken.model_validate(tokens)
        except ValueError:
            return None

    async def set_tokens(self, tokens: Any) -> None:
        record = self.store.load(self.key)
        record.tokens = tokens.model_dump(mode="json", exclude_none=True)
        expires_in = tokens.expires_in
        record.expires_at = time.time() + float(expires_in) if expires_in else None
        self.store.save(self.key, record)

    async def get_client_info(self) -> Any:
        if self.preregistered is not None:
            return self.preregistered
        from mcp.shared.auth import OAuthClientInformationFull

        client = self.store.load(self.key).client
        if not client:
            return None
        try:
            return OAuthClientInformationFull.model_validate(client)
        except ValueError:
            return None

    async def set_client_info(self, client_info: Any) -> None:
        if self.preregistered is not None or not self.login:
            return
        record = self.store.load(self.key)
        record.client = client_info.model_dump(mode="json", exclude_none=True)
        self.store.save(self.key, record)

    def expires_at(self) -> float | None:
        return self.store.load(self.key).expires_at


# -- per-server state the broker keeps --------------------------------------------------------


@dataclass
class KeyState:
    """What the daemon knows of one token record's server (never the tokens themselves)."""

    needs_login: bool = False
    # The last challenge a request got (status, WWW-Authenticate): a login replays it.
    challenge: tuple[int, str | None] | None = None
    scope: str | None = None
    step_up: bool = False  # the login wanted is for one operation's scope (a 403)
    step_ups: int = 0
    # The JSON-RPC method the last 403 insufficient_scope answered: once it goes through, the
    # step-up worked and the count starts again.
    challenged_method: str | None = None
    login_running: bool = False


class _Login:
    """The interactive half of one login: where the URL goes and where the redirect comes."""

    def __init__(self, listener: CallbackListener, on_url: Callable[[str, str], None]) -> None:
        self.listener = listener
        self.on_url = on_url

    async def redirect(self, url: str) -> None:
        self.listener.gate.issue(url)
        self.on_url(url, self.listener.start_url)

    async def callback(self) -> Any:
        from mcp.shared.auth import AuthorizationCodeResult

        result = await self.listener.wait()
        if result.error is not None:
            detail = result.error + (
                f": {result.error_description}" if result.error_description else ""
            )
            raise OAuthError(
                self.listener.server,
                "authorization",
                f"the authorization server answered {detail}",
            )
        return AuthorizationCodeResult(code=result.code or "", state=result.state, iss=result.iss)


def _provider_class() -> type:
    """Our subclass of the SDK provider, built on first use (the SDK is imported only when an
    HTTP upstream starts, as the HTTP client is)."""
    global _PROVIDER
    if _PROVIDER is not None:
        return _PROVIDER
    import httpx2
    from mcp.client.auth import OAuthClientProvider

    class Provider(OAuthClientProvider):
        def __init__(
            self,
            broker: Broker,
            name: str,
            key: str,
            settings: OAuthSettings,
            server_url: str,
            redirect_uri: str,
            login: _Login | None,
        ) -> None:
            from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata

            self.broker = broker
            self.name = name
            self.key = key
            self.settings = settings
            self.login = login
            self.step: Step = "discovery"
            preregistered = None
            if settings.client_id:
                preregistered = OAuthClientInformationFull(
                    client_id=settings.client_id,
                    client_secret=settings.client_secret,
                    redirect_uris=[redirect_uri],  # type: ignore[list-item]
                    token_endpoint_auth_method=None,  # chosen from the server's metadata
                )
            self.storage = _Storage(broker.store, key, preregistered, login=login is not None)
            metadata = OAuthClientMetadata(
                redirect_uris=[redirect_uri],  # type: ignore[list-item]
                client_name=CLIENT_NAME,
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                scope=" ".join(settings.scopes) if settings.scopes else None,
            )
            cimd = settings.client_metadata_url
            super().__init__(
                server_url,
                metadata,
                self.storage,
                redirect_handler=self._redirect,
                callback_handler=self._callback,
                client_metadata_url=cimd,
            )

        # -- the interactive steps: only a login has them --------------------------------

        def _stop(self) -> NeedsLogin:
            state = self.broker.state(self.key)
            step_up = bool(state.challenge and state.challenge[0] == 403)
            scope = self.context.client_metadata.scope
            self.broker.needs_login(self.key, step_up=step_up, scope=scope)
            spent = step_up and state.step_ups >= MAX_STEP_UPS
            return NeedsLogin(self.name, step_up=step_up, scope=scope, spent=spent)

        async def _redirect(self, url: str) -> None:
            self.step = "authorization"
            if self.login is None:
                raise self._stop()
            await self.login.redirect(url)

        async def _callback(self) -> Any:
            assert self.login is not None
            with trio.fail_after(LOGIN_TIMEOUT):
                try:
                    return await self.login.callback()
                except trio.TooSlowError:
                    raise OAuthError(
                        self.name,
                        "authorization",
                        f"the browser did not come back within {LOGIN_TIMEOUT:g} s",
                    ) from None

        # -- what we add to the SDK's steps ------------------------------------------------

        async def _initialize(self) -> None:
            await super()._initialize()
            # The SDK keeps expiry in memory only; a restarted daemon takes it from the store.
            expires_at = self.storage.expires_at()
            if self.context.current_tokens is not None and expires_at is not None:
                self.context.token_expiry_time = expires_at - self._margin()

        def _margin(self) -> float:
            tokens = self.context.current_tokens
            lifetime = float(tokens.expires_in) if tokens and tokens.expires_in else None
            return min(REFRESH_MARGIN, lifetime / 2) if lifetime else REFRESH_MARGIN

        def _early(self) -> None:
            if self.context.token_expiry_time is not None:
                self.context.token_expiry_time -= self._margin()

        async def _handle_token_response(self, response: httpx2.Response) -> None:
            await super()._handle_token_response(response)
            self._early()

        async def _handle_refresh_response(self, response: httpx2.Response) -> bool:
            ok: bool = await super()._handle_refresh_response(response)
            if ok:
                self._early()
            return ok

        def _choose_method(self) -> None:
            info = self.context.client_info
            if info is None or info.token_endpoint_auth_method is not None:
                return
            advertised = (
                self.context.oauth_metadata.token_endpoint_auth_methods_supported
                if self.context.oauth_metadata is not None
                else None
            )
            info.token_endpoint_auth_method = choose_auth_method(
                advertised, bool(info.client_secret)
            )

        async def _exchange_token_authorization_code(
            self, auth_code: str, code_verifier: str
        ) -> httpx2.Request:
            self._choose_method()
            request: httpx2.Request = await super()._exchange_token_authorization_code(
                auth_code, code_verifier
            )
            return request

        async def _refresh_token(self) -> httpx2.Request:
            self._choose_method()
            request: httpx2.Request = await super()._refresh_token()
            return request

        async def _perform_authorization_code_grant(self) -> tuple[str, str]:
            # Scopes the user configured are asked for as well as the ones the spec's order
            # selects (challenge, then scopes_supported).
            if self.settings.scopes:
                chosen = (self.context.client_metadata.scope or "").split()
                wanted = list(dict.fromkeys([*self.settings.scopes, *chosen]))
                self.context.client_metadata.scope = " ".join(wanted)
            result: tuple[str, str] = await super()._perform_authorization_code_grant()
            return result

        def _classify(self, outgoing: httpx2.Request, request: httpx2.Request) -> None:
            if outgoing is request:
                return
            if outgoing.method == "GET":
                self.step = "discovery"
                return
            ctype = outgoing.headers.get("content-type", "")
            if "json" in ctype:
                self.step = "registration"
                return
            body = outgoing.content
            self.step = "refresh" if b"grant_type=refresh_token" in body else "token"

        async def _auth_flow(
            self, request: httpx2.Request
        ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
            refreshed = self.login is not None  # a login asked for a new authorization
            pending: httpx2.Response | None = None
            if self.login is None:
                # The fast path, outside the SDK flow: it holds one lock per provider from
                # sending a request until its response's head, which would serialize every
                # request of the connection behind a slow JSON answer. With a valid token (or
                # none: a server that may never ask) the request just goes; only an answer
                # that asks for authorization enters the flow, which is handed that answer.
                if not self._initialized:
                    await self._initialize()
                tokens = self.context.current_tokens
                if tokens is None or self.context.is_token_valid():
                    if tokens is not None:
                        self._add_auth_header(request)
                    response = yield request
                    self._seen(response)
                    if not _asks_for_auth(response):
                        return
                    pending = response
            while True:
                flow = super()._auth_flow(request)
                retry = False
                try:
                    outgoing = await flow.__anext__()
                    while True:
                        self._classify(outgoing, request)
                        if self.step == "registration" and self.login is None:
                            # Registering names a redirect URI: only a login has one.
                            raise self._stop()
                        if outgoing is request and pending is not None:
                            response, pending = pending, None
                        else:
                            response = yield outgoing
                        if outgoing is not request:
                            response = await self._legacy_metadata(outgoing, response)
                        if outgoing is request:
                            self._seen(response)
                            if (
                                response.status_code == 401
                                and not refreshed
                                and "authorization" in request.headers
                                and self.context.can_refresh_token()
                            ):
                                retry = True
                                break
                        outgoing = await flow.asend(response)
                except StopAsyncIteration:
                    return
                except McpoolError:
                    raise
                except Exception as exc:
                    raise OAuthError(self.name, self.step, _detail(exc)) from exc
                finally:
                    await flow.aclose()
                if not retry:
                    return
                # The server no longer takes the access token: refresh it before asking the
                # user for a new login (the SDK would go straight to one).
                refreshed = True
                self.context.token_expiry_time = 1.0  # long past: the flow refreshes first
                del request.headers["authorization"]

        async def _legacy_metadata(
            self, outgoing: httpx2.Request, response: httpx2.Response
        ) -> httpx2.Response:
            """2025-03-26 back-compat: a server without protected resource metadata has its
            authorization server at its own origin, whose metadata may name an issuer with a
            path (the 2025-03-26 spec has no issuer check). The SDK holds the legacy path to
            RFC 8414 §3.3 too and refuses it; we accept such metadata when its issuer is on
            the server's own origin (the only place the legacy path looks) by presenting it
            to the SDK under that origin. Any other issuer is still refused."""
            if (
                self.context.auth_server_url is not None
                or response.status_code != 200
                or not outgoing.url.path.startswith("/.well-known/oauth-authorization-server")
            ):
                return response
            body = _json_object(await response.aread())
            issuer = body.get("issuer") if body is not None else None
            server = urlsplit(self.context.server_url)
            if body is None or not isinstance(issuer, str):
                return response
            found = urlsplit(issuer)
            if (found.scheme, found.netloc) != (server.scheme, server.netloc) or not found.path:
                return response
            body["issuer"] = f"{server.scheme}://{server.netloc}"
            return httpx2.Response(200, json=body, request=outgoing)

        def _seen(self, response: httpx2.Response) -> None:
            status = response.status_code
            st = self.broker.state(self.key)
            method = _method_of(response.request)
            if status in (401, 403):
                challenge = response.headers.get("www-authenticate")
                if status == 401:
                    st.challenge = (status, challenge)
                elif parse_challenge(challenge).get("error") == "insufficient_scope":
                    st.challenge = (status, challenge)
                    st.challenged_method = method
            elif status < 400 and "authorization" in response.request.headers:
                if method is not None and method == st.challenged_method:
                    st.step_ups = 0  # the step-up worked: the count starts again
                    st.challenged_method = None
                    st.needs_login = False
                elif not st.step_up:
                    # Our token works again (a refresh, another connection's login): a login
                    # this server wanted is no longer wanted. A pending step-up is only
                    # settled by the operation that asked for it.
                    st.needs_login = False

    _PROVIDER = Provider
    return Provider


_PROVIDER: type | None = None


def _asks_for_auth(response: Any) -> bool:
    """A 401, or a 403 insufficient_scope (a step-up), as the SDK flow acts on them."""
    if response.status_code == 401:
        return True
    challenge = parse_challenge(response.headers.get("www-authenticate"))
    return response.status_code == 403 and challenge.get("error") == "insufficient_scope"


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


class _Head(msgspec.Struct):
    method: str | None = None


_head = msgspec.json.Decoder(_Head)


def _method_of(request: Any) -> str | None:
    """The JSON-RPC method a request POSTs, if it is one."""
    if request is None or request.method != "POST":
        return None
    try:
        return _head.decode(request.content).method
    except (msgspec.DecodeError, Exception):
        return None


def _detail(exc: BaseException) -> str:
    """What went wrong, in words: the messages of the exceptions inside `exc`'s groups."""
    texts = [str(leaf).strip() or type(leaf).__name__ for leaf in _leaves(exc)]
    return "; ".join(dict.fromkeys(texts)) or type(exc).__name__


# -- the broker: one per daemon ---------------------------------------------------------------


class Broker:
    """The daemon's OAuth state: the token store, what each server last asked for, logins."""

    # Tests put a fake server here for the login's own requests, as HttpUpstream has.
    transport_factory: Callable[[], Any] | None = None

    def __init__(self, store: TokenStore, log: Callable[..., None] | None = None) -> None:
        self.store = store
        self.log: Callable[..., None] = log or (lambda *_a, **_k: None)
        self._states: dict[str, KeyState] = {}
        # Called with a record key after a login (to reconnect that server's entries).
        self.on_authorized: Callable[[str], None] = lambda _key: None

    # -- keys and state ------------------------------------------------------------------

    @staticmethod
    def key_of(identity: TransportIdentity) -> str | None:
        """The token record of an entry, or None when OAuth is not for it: stdio, OAuth
        switched off, or an `Authorization` header the user manages."""
        if identity.kind not in ("http", "sse") or not identity.url:
            return None
        if any(k == "authorization" for k, _ in identity.headers):
            return None
        settings = oauth_settings_of(identity)
        if settings is not None and not settings.enabled:
            return None
        return token_key(identity.url, oauth_identity(settings))

    def state(self, key: str) -> KeyState:
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = KeyState()
        return st

    def needs_login(self, key: str, *, step_up: bool, scope: str | None) -> None:
        st = self.state(key)
        if not st.needs_login and step_up:
            st.step_ups += 1
        st.needs_login = True
        st.step_up = step_up
        st.scope = scope

    def shown_state(self, identity: TransportIdentity) -> str | None:
        """`needs-login` while this entry's server waits for one, else None."""
        key = self.key_of(identity)
        st = self._states.get(key) if key else None
        return "needs-login" if st is not None and st.needs_login else None

    def authorized(self, identity: TransportIdentity) -> bool:
        key = self.key_of(identity)
        return bool(key and self.store.load(key).tokens)

    # -- the request path ------------------------------------------------------------------

    def auth_for(self, identity: TransportIdentity) -> Any:
        """The `httpx2.Auth` for one connection, or None. A connection never waits for a
        person: where the flow would need one, the request fails with NeedsLogin."""
        key = self.key_of(identity)
        if key is None:
            return None
        assert identity.url is not None
        settings = oauth_settings_of(identity) or OAuthSettings()
        port = settings.callback_port or 0
        redirect = f"http://127.0.0.1:{port}{CALLBACK_PATH}"
        return _provider_class()(self, identity.name, key, settings, identity.url, redirect, None)

    # -- logins ----------------------------------------------------------------------------

    async def login(
        self, identity: TransportIdentity, on_url: Callable[[str, str], None]
    ) -> dict[str, Any]:
        """The interactive authorization of one server: `on_url` gets the URL for the user's
        browser and the loopback address that redirects the user's own uid to it (what a
        browser is started with: see the listener); returns once the tokens are stored, or
        raises one McpoolError naming the server and the step."""
        key = self.key_of(identity)
        name = identity.name
        if key is None or identity.url is None:
            raise OAuthError(name, "authorization", "this server does not use OAuth here")
        st = self.state(key)
        if st.step_ups >= MAX_STEP_UPS:
            raise OAuthError(
                name,
                "authorization",
                f"the server still answers insufficient_scope after {MAX_STEP_UPS} logins "
                f"(scope '{st.scope}'); refused until its settings change or `daemonctl logout "
                f"{name}`",
            )
        if st.login_running:
            raise OAuthError(name, "authorization", "a login for this server is already running")
        settings = oauth_settings_of(identity) or OAuthSettings()
        st.login_running = True
        try:
            await self._login(identity, key, settings, st, on_url)
        except Exception as exc:  # an ExceptionGroup too: the login's nursery raises them
            error = login_failure(name, exc)
            self.log("warning", error.reason, server=name)
            if error is exc:
                raise
            # A cause out of the group is raised as itself, with its own cause (the group
            # that held it would only repeat it).
            raise error from (error.__cause__ if error.__traceback__ else exc)
        finally:
            st.login_running = False
        st.needs_login = False
        st.challenge = None
        tokens = self.store.load(key).tokens or {}
        self.log("info", f"server '{name}' authorized", server=name)
        self.on_authorized(key)
        return {"server": name, "authorized": True, "scope": tokens.get("scope")}

    async def _login(
        self,
        identity: TransportIdentity,
        key: str,
        settings: OAuthSettings,
        st: KeyState,
        on_url: Callable[[str, str], None],
    ) -> None:
        assert identity.url is not None
        listener = await CallbackListener.bind(
            identity.name,
            self._port(key, settings),
            exact=settings.callback_port is not None,
            log=self.log,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(listener.serve)
                self._forget_other_redirect(key, settings, listener.redirect_uri)
                provider = _provider_class()(
                    self,
                    identity.name,
                    key,
                    settings,
                    identity.url,
                    listener.redirect_uri,
                    _Login(listener, on_url),
                )
                await self._drive(identity, provider, st)
                nursery.cancel_scope.cancel()
        finally:
            listener.close()

    def _port(self, key: str, settings: OAuthSettings) -> int:
        """The configured callback port, else the port the stored registration names (so the
        client registered earlier stays usable), else any (0)."""
        if settings.callback_port:
            return settings.callback_port
        client = self.store.load(key).client or {}
        uris = client.get("redirect_uris") or []
        port = urlsplit(uris[0]).port if uris and isinstance(uris[0], str) else None
        return port or 0

    def _forget_other_redirect(self, key: str, settings: OAuthSettings, redirect: str) -> None:
        """A registration for another redirect URI (its port was taken) cannot be used: the
        login registers again."""
        if settings.client_id:
            return
        record = self.store.load(key)
        client = record.client or {}
        if (
            client
            and client.get("client_id") != settings.client_metadata_url
            and redirect not in (client.get("redirect_uris") or [])
        ):
            record.client = None
            self.store.save(key, record)

    async def _drive(self, identity: TransportIdentity, provider: Any, st: KeyState) -> None:
        """Run the SDK flow the way httpx runs an Auth, answering its first request with the
        challenge the server gave (a login is asked for after that request failed)."""
        import httpx2

        name = identity.name
        factory = self.transport_factory
        async with httpx2.AsyncClient(
            timeout=httpx2.Timeout(OAUTH_REQUEST_TIMEOUT),
            follow_redirects=False,
            transport=factory() if factory is not None else None,
        ) as client:
            probe = _probe_request(httpx2, identity)
            challenge = st.challenge
            if challenge is None:
                challenge = await _ask(client, probe, name)
            status, header = challenge
            flow = provider.async_auth_flow(probe)
            answered = False
            try:
                outgoing = await flow.__anext__()
                while True:
                    if outgoing is probe:
                        if answered:
                            return  # authorized: the flow would now send the request again
                        answered = True
                        headers = {"www-authenticate": header} if header else {}
                        response = httpx2.Response(status, headers=headers, request=probe)
                    else:
                        try:
                            response = await client.send(outgoing)
                        except httpx2.HTTPError as exc:
                            raise OAuthError(name, provider.step, _detail(exc)) from exc
                    outgoing = await flow.asend(response)
            except StopAsyncIteration:
                if not answered or not self.store.load(provider.key).tokens:
                    raise OAuthError(
                        name, "authorization", "the flow ended without tokens"
                    ) from None
            finally:
                await flow.aclose()

    def logout(self, identity: TransportIdentity) -> bool:
        """Forget the server's tokens and registration. True when there was something."""
        key = self.key_of(identity)
        if key is None:
            return False
        record = self.store.load(key)
        had = record != TokenRecord()
        self.store.delete(key)
        st = self.state(key)
        st.step_ups = 0
        self.log("info", f"server '{identity.name}' logged out", server=identity.name)
        self.on_authorized(key)  # reconnect: the live connections hold the old token
        return had


def _probe_request(httpx2: Any, identity: TransportIdentity) -> Any:
    assert identity.url is not None
    if identity.kind == "sse":
        return httpx2.Request("GET", identity.url, headers={"accept": "text/event-stream"})
    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LATEST_HANDSHAKE,
            "capabilities": {},
            "clientInfo": {"name": CLIENT_NAME, "version": "0"},
        },
    }
    return httpx2.Request(
        "POST",
        identity.url,
        content=msgspec.json.encode(body),
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        },
    )


async def _ask(client: Any, probe: Any, name: str) -> tuple[int, str | None]:
    """Nothing asked this server yet: send it the first request a connection sends, for its
    challenge. A server that answers without one is asked by its well-known metadata."""
    import httpx2

    try:
        resp = await client.send(probe, stream=True)
    except httpx2.HTTPError as exc:
        raise OAuthError(
            name, "discovery", f"the server could not be reached: {_detail(exc)}"
        ) from exc
    try:
        if resp.status_code in (401, 403):
            return resp.status_code, resp.headers.get("www-authenticate")
        session = resp.headers.get("mcp-session-id")
    finally:
        await resp.aclose()
    if session:
        with contextlib.suppress(httpx2.HTTPError):  # a courtesy: end the session we opened
            await client.delete(str(probe.url), headers={"mcp-session-id": session})
    return 401, None


BROKER: Broker | None = None


def install(broker: Broker | None) -> None:
    """The daemon's broker, which HTTP upstreams ask for their Auth (None: no OAuth)."""
    global BROKER
    BROKER = broker


def auth_for(identity: TransportIdentity) -> Any:
    return BROKER.auth_for(identity) if BROKER is not None else None


def needs_login(upstream: Any, exc: BaseException | None) -> bool:
    """Whether a connection ended because its server wants a login."""
    if getattr(upstream, "needs_login", None) is not None:
        return True
    return exc is not None and _contains(exc, NeedsLogin)


def oauth_failure(upstream: Any) -> str | None:
    """Why a connection's OAuth flow failed (its server and step), when that ended it: what
    the entry says, rather than the errors of the requests that found it closed."""
    error = getattr(upstream, "oauth_error", None)
    return error.reason if isinstance(error, OAuthError) else None


def _contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


__all__ = [
    "Answer",
    "Broker",
    "CallbackListener",
    "CallbackResult",
    "NeedsLogin",
    "OAuthError",
    "OAuthSettings",
    "RedirectGate",
    "choose_auth_method",
    "install",
    "login_failure",
    "oauth_failure",
    "oauth_identity",
    "parse_challenge",
]
