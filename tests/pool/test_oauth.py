"""OAuth (issue 16): the pure decisions, the token store, refresh, logout and X2.

The provider runs against a fake authorization and MCP server behind `httpx2.MockTransport`
(the fake is of the network, as the HTTP upstream tests use it); the callback parser, method
choice and challenge parser are plain functions.
"""

from __future__ import annotations

import json
import logging
import os
import stat
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
    Broker,
    CallbackResult,
    NeedsLogin,
    OAuthSettings,
    choose_auth_method,
    parse_callback,
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


def test_callback_with_our_state_is_taken() -> None:
    head = b"GET /callback?code=abc&state=s1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    assert parse_callback(head, "s1") == (200, CallbackResult(code="abc", state="s1"))


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /callback?code=abc&state=other HTTP/1.1\r\n\r\n", 400),  # not our login
        (b"GET /callback?code=abc HTTP/1.1\r\n\r\n", 400),
        (b"GET /callback?state=s1 HTTP/1.1\r\n\r\n", 400),  # neither code nor error
        (b"GET /favicon.ico HTTP/1.1\r\n\r\n", 404),
        (b"POST /callback?code=abc&state=s1 HTTP/1.1\r\n\r\n", 405),
        (b"garbage", 405),
    ],
)
def test_other_requests_to_the_listener_are_refused(head: bytes, status: int) -> None:
    assert parse_callback(head, "s1") == (status, None)


def test_callback_error_is_reported() -> None:
    head = b"GET /callback?error=access_denied&error_description=no&state=s1 HTTP/1.1\r\n\r\n"
    _, result = parse_callback(head, "s1")
    assert result is not None
    assert (result.error, result.error_description) == ("access_denied", "no")


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

            def on_url(url: str) -> None:
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
        await broker.login(_identity(), lambda url: None)
    broker.logout(_identity())
    assert broker.state(key).step_ups == 0


# -- the pool: needs-login is a state, not a retry loop ----------------------------------------

ORIGIN = "http://127.0.0.1:1"


class GatedServer:
    """A streamable HTTP (or HTTP+SSE) MCP server that wants a bearer token for everything."""

    def __init__(self) -> None:
        self.refused = 0
        self.registrations = 0

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path == "/.well-known/oauth-protected-resource/mcp":
            return httpx2.Response(
                200, json={"resource": f"{ORIGIN}/mcp", "authorization_servers": [ORIGIN]}
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
