"""OAuth (issue 16): the pure decisions, the token store, refresh, logout and X2.

The provider runs against a fake authorization and MCP server behind `httpx2.MockTransport`
(the fake is of the network, as the HTTP upstream tests use it); the callback parser, method
choice and challenge parser are plain functions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import msgspec
import pytest
import trio

from mcpool.pool import ServerSettings, identity_of
from mcpool.pool._oauth import (
    Answer,
    Broker,
    CallbackResult,
    NeedsLogin,
    OAuthSettings,
    RedirectGate,
    choose_auth_method,
    parse_challenge,
)
from mcpool.pool._tokens import FileBackend, TokenRecord, TokenStore, token_key

URL = "http://mcp.test/mcp"
OLD, NEW = "access-old-0123456789", "access-new-9876543210"
REFRESH = "refresh-abcdefghij"
WAIT = 10.0  # everything here is in memory or on loopback; this only turns a hang into a failure


def _identity(**oauth: Any) -> Any:
    settings = ServerSettings(type="http", url=URL)
    if oauth:
        settings.oauth = msgspec.convert(oauth, OAuthSettings)
    return identity_of("remote", settings)


# -- pure parts ---------------------------------------------------------------------------------


AUTH_URL = "http://as.test/authorize?client_id=c1&state=s1&code_challenge=ch"


def _gate() -> RedirectGate:
    gate = RedirectGate()
    gate.issue(AUTH_URL)
    return gate


def test_callback_with_our_state_is_taken_once() -> None:
    gate = _gate()
    head = b"GET /callback?code=abc&state=s1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    assert gate.judge(head) == Answer(200, result=CallbackResult(code="abc", state="s1"))
    # The state is single-use: the same callback again (another code, or an error) is refused
    # and leaves the login as it is.
    for again in (head, b"GET /callback?error=access_denied&state=s1 HTTP/1.1\r\n\r\n"):
        answer = gate.judge(again)
        assert (answer.status, answer.result) == (400, None)
        assert answer.refused == "a callback whose state was already used"
    assert gate.judge(b"GET / HTTP/1.1\r\n\r\n").status == 410  # the start page too


@pytest.mark.parametrize(
    ("head", "status", "refused"),
    [
        (b"GET /callback?code=abc&state=other HTTP/1.1\r\n\r\n", 400, "another login's state"),
        (b"GET /callback?code=abc HTTP/1.1\r\n\r\n", 400, "without a state"),
        (b"GET /callback?state=s1 HTTP/1.1\r\n\r\n", 400, "neither a code nor an error"),
        (b"GET /favicon.ico HTTP/1.1\r\n\r\n", 404, None),
        (b"GET /?state=s1 HTTP/1.1\r\n\r\n", 404, None),
        (b"POST /callback?code=abc&state=s1 HTTP/1.1\r\n\r\n", 405, None),
        (b"garbage", 405, None),
        (b"", 405, None),
    ],
)
def test_other_requests_to_the_listener_are_refused_and_change_nothing(
    head: bytes, status: int, refused: str | None
) -> None:
    gate = _gate()
    answer = gate.judge(head)
    assert (answer.status, answer.result, answer.location) == (status, None, None)
    assert (refused is None) == (answer.refused is None)
    assert refused is None or refused in (answer.refused or "")
    # The login still waits for its own callback.
    taken = gate.judge(b"GET /callback?code=abc&state=s1 HTTP/1.1\r\n\r\n")
    assert taken.status == 200


def test_the_start_page_redirects_to_the_authorization_url() -> None:
    assert RedirectGate().judge(b"GET / HTTP/1.1\r\n\r\n").status == 410  # none yet
    assert _gate().judge(b"GET / HTTP/1.1\r\n\r\n") == Answer(303, location=AUTH_URL)


def test_a_state_is_bound_to_the_login_that_issued_it() -> None:
    gate = _gate()
    gate.issue("http://as.test/authorize?state=s2")  # the next login
    assert gate.judge(b"GET /callback?code=abc&state=s1 HTTP/1.1\r\n\r\n").status == 400
    assert gate.judge(b"GET /callback?code=abc&state=s2 HTTP/1.1\r\n\r\n").status == 200


def test_callback_error_is_reported() -> None:
    head = b"GET /callback?error=access_denied&error_description=no&state=s1 HTTP/1.1\r\n\r\n"
    result = _gate().judge(head).result
    assert result is not None
    assert (result.error, result.error_description) == ("access_denied", "no")


def test_an_oauth_failure_out_of_nested_groups_is_one_sentence() -> None:
    from mcpool.pool._oauth import OAuthError, login_failure

    inner = OAuthError("gh", "token", 'Token exchange failed (400): {"error":\n"invalid_grant"}')
    group = ExceptionGroup("Exceptions from Trio nursery", [ExceptionGroup("x", [inner])])
    assert login_failure("gh", group) is inner
    assert inner.reason == (
        "server 'gh': OAuth token request failed: Token exchange failed (400): "
        '{"error": "invalid_grant"}'
    )
    plain = ExceptionGroup("g", [KeyError("client_id"), ValueError("bad\x1b[31m json")])
    error = login_failure("gh", plain)
    assert error.reason == (
        "server 'gh': OAuth authorization failed: 'client_id'; bad\\x1b[31m json"
    )
    assert "ExceptionGroup" not in error.reason and "\n" not in error.reason
    long = OAuthError("gh", "discovery", "x" * 5000)
    assert len(long.reason) < 400 and long.reason.endswith("...")


@pytest.mark.parametrize(
    ("advertised", "secret", "method"),
    [
        (None, True, "client_secret_basic"),  # RFC 8414's default
        (["client_secret_post"], True, "client_secret_post"),
        (["client_secret_post", "client_secret_basic"], True, "client_secret_basic"),
        (["none"], True, "none"),
        (["client_secret_basic"], False, "none"),
    ],
)
def test_token_endpoint_method_follows_the_server(
    advertised: list[str] | None, secret: bool, method: str
) -> None:
    assert choose_auth_method(advertised, secret) == method


def test_challenge_params() -> None:
    header = 'Bearer error="insufficient_scope", scope="a b", resource_metadata="http://x/y"'
    assert parse_challenge(header) == {
        "error": "insufficient_scope",
        "scope": "a b",
        "resource_metadata": "http://x/y",
    }


def test_oauth_settings_are_part_of_the_identity_and_tokens_are_not(tmp_path: Path) -> None:
    plain, registered = _identity(), _identity(clientId="c1")
    assert plain.fingerprint != registered.fingerprint
    assert Broker.key_of(plain) != Broker.key_of(registered)
    assert identity_of("remote", ServerSettings(type="http", url=URL)) == plain
    # A static Authorization header is the user's own auth: no OAuth for that entry.
    with_header = identity_of(
        "remote", ServerSettings(type="http", url=URL, headers={"Authorization": "Bearer x"})
    )
    assert Broker.key_of(with_header) is None
    assert Broker.key_of(_identity(enabled=False)) is None


# -- the file store ----------------------------------------------------------------------------


def test_file_store_is_private_and_atomic(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "oauth"
    store = TokenStore(folder, backend=FileBackend(folder))
    key = token_key(URL, None)
    store.save(key, TokenRecord(tokens={"access_token": OLD}, expires_at=1.0))
    path = folder / f"{key}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == [path.name]  # no temporary left
    assert store.load(key).tokens == {"access_token": OLD}
    path.write_bytes(b"{not json")
    assert store.load(key) == TokenRecord()  # damaged: logged out, not a daemon that fails
    store.delete(key)
    assert not path.exists()


def test_store_without_a_keyring_backend_is_the_file(tmp_path: Path) -> None:
    # Here (no desktop session) keyring has no usable backend, or is not installed.
    assert TokenStore(tmp_path).backend.name == "file"


# -- refresh ---------------------------------------------------------------------------------


class FakeServer:
    """An MCP server that takes one access token, and its token endpoint."""

    def __init__(self, accepted: str, *, refresh_ok: bool = True) -> None:
        self.accepted = accepted
        self.refresh_ok = refresh_ok
        self.token_requests: list[dict[str, str]] = []
        self.seen_tokens: list[str | None] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/token":
            form = dict(httpx2.QueryParams(request.content.decode()))
            self.token_requests.append(form)
            if not self.refresh_ok:
                return httpx2.Response(400, json={"error": "invalid_grant"})
            self.accepted = NEW
            return httpx2.Response(
                200, json={"access_token": NEW, "token_type": "Bearer", "expires_in": 3600}
            )
        if request.url.path == "/mcp":
            auth = request.headers.get("authorization")
            self.seen_tokens.append(auth)
            if auth == f"Bearer {self.accepted}":
                return httpx2.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {}})
            return httpx2.Response(
                401, headers={"www-authenticate": 'Bearer error="invalid_token"'}
            )
        return httpx2.Response(404)


def _broker(tmp_path: Path, lines: list[str]) -> tuple[Broker, str]:
    store = TokenStore(tmp_path, backend=FileBackend(tmp_path))
    broker = Broker(store, log=lambda level, msg, **f: lines.append(f"{msg} {json.dumps(f)}"))
    key = Broker.key_of(_identity())
    assert key is not None
    return broker, key


def _stored(broker: Broker, key: str, *, expires_at: float) -> None:
    broker.store.save(
        key,
        TokenRecord(
            tokens={"access_token": OLD, "refresh_token": REFRESH, "expires_in": 3600},
            expires_at=expires_at,
            client={"client_id": "c1", "redirect_uris": ["http://127.0.0.1:9/callback"]},
        ),
    )


async def _post(broker: Broker, server: FakeServer) -> httpx2.Response:
    auth = broker.auth_for(_identity())
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(server), auth=auth) as client:
        return await client.post(URL, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})


async def test_token_is_refreshed_before_it_expires(tmp_path: Path) -> None:
    lines: list[str] = []
    broker, key = _broker(tmp_path, lines)
    # Stored by an earlier daemon: it expires within the refresh margin.
    _stored(broker, key, expires_at=time.time() + 5)
    server = FakeServer(accepted=OLD)
    response = await _post(broker, server)
    assert response.status_code == 200
    assert [r["grant_type"] for r in server.token_requests] == ["refresh_token"]
    assert server.token_requests[0]["refresh_token"] == REFRESH
    assert server.seen_tokens == [f"Bearer {NEW}"]  # never sent the expiring one
    record = broker.store.load(key)
    assert record.tokens is not None
    assert record.tokens["access_token"] == NEW
    assert record.tokens["refresh_token"] == REFRESH  # kept: the server did not rotate it
    assert record.expires_at is not None and record.expires_at > time.time() + 3000


async def test_a_401_is_answered_by_a_refresh_before_any_login(tmp_path: Path) -> None:
    lines: list[str] = []
    broker, key = _broker(tmp_path, lines)
    _stored(broker, key, expires_at=time.time() + 3600)
    broker.needs_login(key, step_up=False, scope=None)  # as an earlier connection left it
    server = FakeServer(accepted="revoked-by-the-server")
    response = await _post(broker, server)
    assert response.status_code == 200
    assert [r["grant_type"] for r in server.token_requests] == ["refresh_token"]
    assert server.seen_tokens == [f"Bearer {OLD}", f"Bearer {NEW}"]
    assert not broker.state(key).needs_login  # the token works again: no login wanted


async def test_failed_refresh_needs_a_login_and_opens_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    broker, key = _broker(tmp_path, lines)
    _stored(broker, key, expires_at=time.time() - 10)
    server = FakeServer(accepted=OLD, refresh_ok=False)
    with pytest.raises(NeedsLogin) as caught:
        await _post(broker, server)
    assert "daemonctl login remote" in caught.value.reason
    assert broker.state(key).needs_login
    assert broker.shown_state(_identity()) == "needs-login"
    for text in [*lines, caught.value.reason, json.dumps(caught.value.data)]:
        for secret in (OLD, NEW, REFRESH):
            assert secret not in text


def test_logout_forgets_the_server(tmp_path: Path) -> None:
    lines: list[str] = []
    broker, key = _broker(tmp_path, lines)
    _stored(broker, key, expires_at=time.time() + 3600)
    reconnected: list[str] = []
    broker.on_authorized = reconnected.append
    assert broker.logout(_identity()) is True
    assert broker.store.load(key) == TokenRecord()
    assert not any(tmp_path.glob("*.json"))
    assert reconnected == [key]  # live connections drop the token they hold
    assert broker.logout(_identity()) is False
    assert all(OLD not in line and REFRESH not in line for line in lines)


def test_sdk_flow_errors_do_not_reach_stderr() -> None:
    # The SDK logs flow errors (with tracebacks) at ERROR; we report them ourselves, named.
    assert logging.getLogger("mcp.client.auth").propagate is False


def test_store_file_never_world_readable_even_with_a_loose_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        folder = tmp_path / "oauth"
        FileBackend(folder).save("k", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((folder / "k.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_oauth_settings_errors_name_the_field() -> None:
    from mcpool.daemon._settings import parse_settings
    from mcpool.protocol import SettingsError

    entry = {"type": "http", "url": URL, "oauth": {"callbackPort": 0}}
    with pytest.raises(SettingsError) as caught:
        parse_settings(json.dumps({"mcpServers": {"gh": entry}}).encode(), "c.json")
    assert caught.value.data["server"] == "gh"
    assert caught.value.data["field"] == "oauth.callbackPort"
    # gemini-cli's extra fields are other clients' business: ignored, not an error.
    entry = {"type": "http", "url": URL, "oauth": {"clientId": "a", "authorizationUrl": "u"}}
    doc = parse_settings(json.dumps({"mcpServers": {"gh": entry}}).encode(), "c.json")
    assert doc.mcp_servers["gh"].oauth == OAuthSettings(client_id="a")
    entry = {"type": "http", "url": URL, "oauth": {"clientMetadataUrl": "http://x/doc.json"}}
    with pytest.raises(SettingsError, match="https URL with a path"):
        parse_settings(json.dumps({"mcpServers": {"gh": entry}}).encode(), "c.json")


# -- a login, with the daemon's real loopback listener ---------------------------------------

AS = "http://as.test"


def _authorization_server(seen: dict[str, Any]) -> Any:
    def handle(request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        if url == URL:
            prm = "http://mcp.test/.well-known/oauth-protected-resource/mcp"
            return httpx2.Response(
                401, headers={"www-authenticate": f'Bearer resource_metadata="{prm}", scope="s1"'}
            )
        if url.endswith("/.well-known/oauth-protected-resource/mcp"):
            return httpx2.Response(200, json={"resource": URL, "authorization_servers": [AS]})
        if url == f"{AS}/.well-known/oauth-authorization-server":
            return httpx2.Response(
                200,
                json={
                    "issuer": AS,
                    "authorization_endpoint": f"{AS}/authorize",
                    "token_endpoint": f"{AS}/token",
                    "registration_endpoint": f"{AS}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                },
            )
        if url == f"{AS}/register":
            body = json.loads(request.content)
            seen["registered"] = body
            return httpx2.Response(
                201, json={"client_id": "c9", "redirect_uris": body["redirect_uris"]}
            )
        if url == f"{AS}/token":
            seen["token"] = dict(httpx2.QueryParams(request.content.decode()))
            return httpx2.Response(
                200,
                json={"access_token": NEW, "refresh_token": REFRESH, "expires_in": 3600},
            )
        return httpx2.Response(404)

    return handle


async def _browser(url: str, answers: list[int]) -> None:
    """What the user's browser does after the authorization server approved: follow the
    redirect to the daemon (first a request that is not our login's, which is refused)."""
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    redirect = urlsplit(query["redirect_uri"])
    for state in ("someone-else", query["state"]):
        stream = await trio.open_tcp_stream("127.0.0.1", redirect.port or 0)
        async with stream:
            target = f"{redirect.path}?code=the-code&state={state}"
            await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = b""
            while chunk := await stream.receive_some():
                head += chunk
        answers.append(int(head.split(b" ", 2)[1]))


async def test_login_through_the_loopback_listener(tmp_path: Path) -> None:
    lines: list[str] = []
    broker, key = _broker(tmp_path, lines)
    seen: dict[str, Any] = {}
    broker.transport_factory = lambda: httpx2.MockTransport(_authorization_server(seen))
    authorized: list[str] = []
    broker.on_authorized = authorized.append
    urls: list[str] = []
    answers: list[int] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            def on_url(url: str, start_url: str) -> None:
                urls.append(url)
                nursery.start_soon(_browser, url, answers)

            result = await broker.login(_identity(), on_url)
    assert result == {"server": "remote", "authorized": True, "scope": "s1"}
    assert answers == [400, 200]
    (url,) = urls
    query = dict(httpx2.QueryParams(urlsplit(url).query))
    assert query["code_challenge_method"] == "S256"
    assert query["resource"] == URL  # RFC 8707
    assert query["scope"] == "s1"  # from the challenge
    assert query["redirect_uri"] == seen["registered"]["redirect_uris"][0]
    assert seen["token"]["code"] == "the-code"
    assert seen["token"]["code_verifier"]
    record = broker.store.load(key)
    assert record.tokens is not None
    assert record.tokens["access_token"] == NEW
    assert authorized == [key]  # the server's entries reconnect
    assert not broker.state(key).needs_login
    for text in [*lines, json.dumps(result), url]:
        assert NEW not in text
        assert REFRESH not in text


async def test_step_up_logins_are_bounded(tmp_path: Path) -> None:
    from mcpool.pool._oauth import MAX_STEP_UPS, OAuthError

    broker, key = _broker(tmp_path, [])
    for _ in range(MAX_STEP_UPS):
        broker.needs_login(key, step_up=True, scope="admin")
        broker.needs_login(key, step_up=True, scope="admin")  # same episode: counted once
        broker.state(key).needs_login = False  # as a login does
    assert broker.state(key).step_ups == MAX_STEP_UPS
    with pytest.raises(OAuthError, match="insufficient_scope after 3 logins"):
        await broker.login(_identity(), lambda url, start_url: None)
    broker.logout(_identity())
    assert broker.state(key).step_ups == 0


# -- the pool: needs-login is a state, not a retry loop ----------------------------------------

ORIGIN = "http://127.0.0.1:1"


class GatedServer:
    """A streamable HTTP (or HTTP+SSE) MCP server that wants a bearer token for everything."""

    def __init__(self, resource: str = f"{ORIGIN}/mcp") -> None:
        self.refused = 0
        self.registrations = 0
        self.resource = resource  # what its protected resource metadata says it is

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path == "/.well-known/oauth-protected-resource/mcp":
            return httpx2.Response(
                200, json={"resource": self.resource, "authorization_servers": [ORIGIN]}
            )
        if path == "/.well-known/oauth-authorization-server":
            return httpx2.Response(
                200,
                json={
                    "issuer": ORIGIN,
                    "authorization_endpoint": f"{ORIGIN}/authorize",
                    "token_endpoint": f"{ORIGIN}/token",
                    "registration_endpoint": f"{ORIGIN}/register",
                },
            )
        if path == "/register":
            self.registrations += 1
            return httpx2.Response(400)
        if request.headers.get("authorization") != f"Bearer {NEW}":
            self.refused += 1
            prm = f"{ORIGIN}/.well-known/oauth-protected-resource/mcp"
            return httpx2.Response(
                401, headers={"www-authenticate": f'Bearer resource_metadata="{prm}"'}
            )
        if request.method != "POST":
            return httpx2.Response(405 if request.method == "GET" else 200)
        msg = json.loads(request.content)
        if "id" not in msg:
            return httpx2.Response(202)
        result: dict[str, Any] = {"tools": [{"name": "gated", "inputSchema": {"type": "object"}}]}
        if msg["method"] == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "gated", "version": "1"},
            }
        return httpx2.Response(200, json={"jsonrpc": "2.0", "id": msg["id"], "result": result})


class _Listener:
    def snapshot_changed(self, entry: Any) -> None:
        pass

    def upstream_notification(self, entry: Any, method: str, params: object) -> None:
        pass

    def server_request(self, entry: Any, upstream: object, msg: object) -> str | None:
        return "no"


@pytest.fixture
def installed(tmp_path: Path) -> Any:
    from mcpool.pool import _oauth

    broker = Broker(TokenStore(tmp_path, backend=FileBackend(tmp_path)))
    _oauth.install(broker)
    yield broker
    _oauth.install(None)


@pytest.mark.parametrize("kind", ["http", "sse"])
async def test_an_entry_waits_in_needs_login_until_a_login_restarts_it(
    kind: str, installed: Broker, nursery: trio.Nursery, autojump_clock: Any
) -> None:
    from mcpool.pool import EntryState, Pool, PoolOptions
    from mcpool.pool._http import HttpUpstream

    server = GatedServer()

    class Gated(HttpUpstream):
        transport_factory = staticmethod(lambda: httpx2.MockTransport(server.handle))

    pool = Pool(
        nursery, PoolOptions(backoff_initial=0.01, backoff_max=0.05), upstream_factory=Gated
    )
    settings = ServerSettings(type=kind, url=f"{ORIGIN}/mcp")  # type: ignore[arg-type]
    identity = identity_of("gated", settings)
    with trio.fail_after(WAIT):
        handle = await pool.acquire(identity, settings, "s1", _Listener())
    entry = handle.entry
    assert entry.state is EntryState.NEEDS_LOGIN
    assert "daemonctl login gated" in (entry.last_error or "")
    assert server.registrations == 0  # registering is the login's, with its redirect URI
    refused = server.refused
    await trio.sleep(60)  # far past the backoff: nothing retries a server that wants a login
    assert server.refused == refused
    assert entry.state is EntryState.NEEDS_LOGIN
    if kind == "http":
        # What a login leaves behind: tokens in the store, then the entry's restart.
        key = Broker.key_of(identity)
        assert key is not None
        installed.store.save(key, TokenRecord(tokens={"access_token": NEW, "token_type": "Bearer"}))
        pool.restart_entry(entry)
        with trio.fail_after(WAIT):
            while entry.state is not EntryState.ACTIVE:
                await entry.state_changed.wait()
        assert [t["name"] for t in entry.snapshot.tools] == ["gated"]
    pool.release(handle)
    await pool.aclose()


@pytest.mark.parametrize("kind", ["http", "sse"])
async def test_an_oauth_step_that_fails_is_the_entrys_error_in_one_sentence(
    kind: str, installed: Broker, nursery: trio.Nursery, autojump_clock: Any
) -> None:
    from mcpool.pool import Pool, PoolOptions
    from mcpool.pool._http import HttpUpstream

    server = GatedServer(resource=f"{ORIGIN}/another")

    class Gated(HttpUpstream):
        transport_factory = staticmethod(lambda: httpx2.MockTransport(server.handle))

    pool = Pool(nursery, PoolOptions(), upstream_factory=Gated)
    settings = ServerSettings(type=kind, url=f"{ORIGIN}/mcp")  # type: ignore[arg-type]
    with trio.fail_after(WAIT):
        handle = await pool.acquire(identity_of("gated", settings), settings, "s1", _Listener())
    assert handle.entry.last_error == (
        f"server 'gated': OAuth discovery failed: Protected resource {ORIGIN}/another does not "
        f"match expected {ORIGIN}/mcp"
    )
    pool.release(handle)
    await pool.aclose()


class FakeKeyring:
    """The three calls of the `keyring` module the store makes."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, user: str) -> str | None:
        return self.entries.get((service, user))

    def set_password(self, service: str, user: str, password: str) -> None:
        self.entries[(service, user)] = password

    def delete_password(self, service: str, user: str) -> None:
        del self.entries[(service, user)]


def test_keyring_backend_keeps_records_out_of_files(tmp_path: Path) -> None:
    from mcpool.pool._tokens import KEYRING_SERVICE, KeyringBackend

    keyring = FakeKeyring()
    store = TokenStore(tmp_path, backend=KeyringBackend(keyring))
    key = token_key(URL, None)
    store.save(key, TokenRecord(tokens={"access_token": OLD}))
    assert list(keyring.entries) == [(KEYRING_SERVICE, key)]
    assert store.load(key).tokens == {"access_token": OLD}
    assert not any(tmp_path.iterdir())
    store.delete(key)
    store.delete(key)  # already gone: not an error
    assert store.load(key) == TokenRecord()


async def test_requests_with_a_valid_token_are_not_serialized(tmp_path: Path) -> None:
    # The SDK flow holds a lock from a request until its answer's head: a slow JSON answer
    # (a long tool call) would hold every other request of the connection behind it.
    broker, key = _broker(tmp_path, [])
    _stored(broker, key, expires_at=time.time() + 3600)
    second_arrived = trio.Event()

    async def handle(request: httpx2.Request) -> httpx2.Response:
        assert request.headers["authorization"] == f"Bearer {OLD}"
        if json.loads(request.content)["id"] == 1:
            await second_arrived.wait()  # answers only once the other request got through
        else:
            second_arrived.set()
        return httpx2.Response(200, json={"jsonrpc": "2.0", "id": 0, "result": {}})

    auth = broker.auth_for(_identity())
    transport = httpx2.MockTransport(handle)
    async with httpx2.AsyncClient(transport=transport, auth=auth) as client:

        async def post(uid: int) -> None:
            body = {"jsonrpc": "2.0", "id": uid, "method": "tools/call"}
            assert (await client.post(URL, json=body)).status_code == 200

        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, 1)
                await trio.sleep(0.01)
                nursery.start_soon(post, 2)


# -- the listener, on real sockets -----------------------------------------------------------


async def _listener(lines: list[dict[str, Any]]) -> Any:
    from mcpool.pool._oauth import CallbackListener

    def log(level: str, msg: str, **fields: Any) -> None:
        lines.append({"level": level, "msg": msg, **fields})

    listener = await CallbackListener.bind("remote", 0, exact=False, log=log)
    listener.gate.issue(AUTH_URL)
    return listener


async def _get(port: int, target: str) -> int | None:
    """One request from our own uid: the answer's status (None: closed without one)."""
    with trio.fail_after(WAIT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
    return int(answer.split(b" ", 2)[1]) if answer else None


async def test_silent_and_dribbling_connections_do_not_hold_up_the_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mcpool.pool import _oauth

    monkeypatch.setattr(_oauth, "CALLBACK_READ_TIMEOUT", 2.0)
    listener = await _listener([])
    dribbled = trio.Event()

    async def dribble() -> None:
        # One byte every 0.2 s, forever: a deadline per read would never cut it; the head's
        # one deadline does.
        stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while True:
                    await stream.send_all(b"G")
                    await trio.sleep(0.2)
        dribbled.set()

    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.serve)
            silent = [await trio.open_tcp_stream("127.0.0.1", listener.port) for _ in range(10)]
            nursery.start_soon(dribble)
            assert await _get(listener.port, "/callback?code=abc&state=s1") == 200
            assert not dribbled.is_set()  # answered while the others still hold theirs
            assert await listener.wait() == CallbackResult(code="abc", state="s1")
            await dribbled.wait()
            for stream in silent:  # each was answered and closed at its deadline
                answer = b""
                while chunk := await stream.receive_some():
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 405 "), answer
                await stream.aclose()
            nursery.cancel_scope.cancel()
    listener.close()


async def test_a_head_past_its_byte_bound_ends_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mcpool.pool import _oauth

    monkeypatch.setattr(_oauth, "CALLBACK_READ_TIMEOUT", 3600.0)  # only the byte bound ends it
    listener = await _listener([])
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.serve)
            stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
            async with stream:
                # More than a head may hold, and no end of head: answered (or reset, with the
                # rest unread) once MAX_CALLBACK_HEAD bytes came.
                with contextlib.suppress(trio.BrokenResourceError):
                    await stream.send_all(b"GET /" + b"a" * (4 * _oauth.MAX_CALLBACK_HEAD))
                    while await stream.receive_some():
                        pass
            assert await _get(listener.port, "/callback?code=abc&state=s1") == 200
            nursery.cancel_scope.cancel()
    listener.close()


async def test_another_users_connections_are_closed_unread_and_logged_once_a_minute(
    other_user: Any,
) -> None:
    lines: list[dict[str, Any]] = []
    listener = await _listener(lines)
    # The other user delivers our own callback (state and all) five times, as an attacker who
    # read the authorization URL would: each connection is closed without an answer.
    script = other_user.script(
        "inject.py",
        "import json, socket, sys\n"
        "answers = []\n"
        "for _ in range(5):\n"
        f"    s = socket.create_connection(('127.0.0.1', {listener.port}), timeout=10)\n"
        "    s.sendall(b'GET /callback?code=theirs&state=s1 HTTP/1.1\\r\\n\\r\\n')\n"
        "    try:\n"
        "        answers.append(s.recv(65536).decode())\n"
        "    except OSError as exc:\n"
        "        answers.append(type(exc).__name__)\n"
        "print(json.dumps(answers))\n",
    )
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.serve)
            proc = other_user.popen(["/usr/bin/python3", str(script)], stdout=subprocess.PIPE)
            out, _ = await trio.to_thread.run_sync(proc.communicate)
            answers = json.loads(out)
            assert all(not a.startswith("HTTP") for a in answers), answers
            # Our own callback is still the one the login takes.
            assert await _get(listener.port, "/callback?code=ours&state=s1") == 200
            assert (await listener.wait()).code == "ours"
            nursery.cancel_scope.cancel()
    listener.close()
    refusals = [line for line in lines if line.get("uid") == other_user.uid]
    assert [r["count"] for r in refusals] == [1, 4], refusals  # at once, then at close
    assert "another user" in refusals[0]["msg"]
