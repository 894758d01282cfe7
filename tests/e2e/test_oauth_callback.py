"""Issue 26 item 2 (X7): the OAuth redirect serves only its owner, and the URL stays off argv.

Real processes throughout: a daemon, `daemonctl login` with a `$BROWSER` script, the accounts
server of tests/e2e/oauth_server.py (an authorization server whose `whoami` tool names the
account a token belongs to), and a second local uid (`other_user`) that plays the attacker:
it authorizes its own account with the owner's state and PKCE challenge, as one who read the
authorization URL would, and delivers that code (or an error) to the daemon's loopback
redirect. The owner's login must complete anyway, with the owner's account.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import trio
from other_user import SYSTEM_PYTHON, OtherUser

from .harness import DaemonFactory, DaemonProcess, daemonctl_argv

SERVER = Path(__file__).with_name("oauth_server.py")
NAME = "acct"
# A Python start plus a few loopback exchanges; only turns a hang into a failure.
STEP_TIMEOUT = 20.0
# `daemonctl login` runs until the redirect came back and the tokens are stored.
LOGIN_TIMEOUT = 60.0

# The owner's browser: record argv, wait for the test's go (a file), then fetch what it was given
# as a browser does (following redirects, as the owner's account), and say how that ended.
BROWSER = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys, time, urllib.request
    out = {out!r}
    with open(os.path.join(out, "argv.json"), "w") as f:
        json.dump(sys.argv, f)
    if {record_only!r}:
        sys.exit(0)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)
    request = urllib.request.Request(sys.argv[1], headers={{"X-Account": "owner"}})
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            result = {{"status": resp.status, "body": resp.read().decode(errors="replace")}}
    except Exception as exc:
        result = {{"error": repr(exc)}}
    with open(os.path.join(out, "browser.json"), "w") as f:
        json.dump(result, f)
    """
)

# The attacker, as the other uid (system Python, stdlib): authorize its own account with the
# owner's authorization URL, without following the redirect to the daemon, then deliver that
# redirect (or an error in its place) to the daemon's listener itself, and report the answer.
ATTACKER = textwrap.dedent(
    """\
    import json, socket, sys, urllib.error, urllib.request
    from urllib.parse import parse_qs, urlencode, urlsplit
    url, mode = sys.argv[1], sys.argv[2]

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    def deliver(target):
        where = urlsplit(target)
        answer, error = b"", None
        try:
            with socket.create_connection((where.hostname, where.port), timeout=10) as s:
                path = where.path + ("?" + where.query if where.query else "")
                s.sendall(f"GET {path} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n".encode())
                while chunk := s.recv(65536):
                    answer += chunk
        except OSError as exc:
            error = type(exc).__name__
        return {"answer": answer.decode(errors="replace"), "error": error}

    if mode == "fetch":  # a plain GET of what the owner's browser was given
        print(json.dumps(deliver(url)))
        sys.exit(0)
    opener = urllib.request.build_opener(Stay)
    request = urllib.request.Request(url, headers={"X-Account": "attacker"})
    try:
        opener.open(request, timeout=10)
        raise SystemExit("the authorization server did not redirect")
    except urllib.error.HTTPError as exc:
        location = exc.headers["Location"]
    if mode == "error":
        where = urlsplit(location)
        state = parse_qs(where.query)["state"][0]
        query = urlencode({"error": "access_denied", "state": state})
        location = f"{where.scheme}://{where.netloc}{where.path}?{query}"
    print(json.dumps(deliver(location)))
    """
)


@asynccontextmanager
async def accounts_server(*options: str) -> AsyncIterator[str]:
    """tests/e2e/oauth_server.py running; yields its origin."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(SERVER), *options], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(STEP_TIMEOUT):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some()
                assert chunk, "the accounts server exited before listening"
                line += chunk
        yield f"http://127.0.0.1:{json.loads(line)['port']}"
    finally:
        proc.kill()
        with trio.move_on_after(STEP_TIMEOUT):
            await proc.wait()


def _printed_url(stderr: bytes) -> str | None:
    """The URL daemonctl printed under "Open this URL ...", once its line is complete."""
    match = re.search(rb"Open this URL[^\n]*\n  (\S+)\n", stderr)
    return match.group(1).decode() if match else None


class Login:
    """One `daemonctl login acct` in the background, with the browser script as $BROWSER."""

    def __init__(self, daemon: DaemonProcess, out: Path, *, record_only: bool = False) -> None:
        self.out = out
        out.mkdir(exist_ok=True)
        browser = out / "browser"
        browser.write_text(
            BROWSER.format(python=sys.executable, out=str(out), record_only=record_only)
        )
        browser.chmod(0o755)
        self.env = {**daemon.env, "BROWSER": str(browser)}
        self.argv = daemonctl_argv(daemon.sock, "login", NAME)
        self.proc: trio.Process | None = None
        self._stderr = b""

    async def start(self) -> str:
        """Start the login; the authorization URL daemonctl prints for its user."""
        self.proc = await trio.lowlevel.open_process(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stderr is not None
        with trio.fail_after(STEP_TIMEOUT):
            while (url := _printed_url(self._stderr)) is None:
                chunk = await self.proc.stderr.receive_some()
                assert chunk, f"daemonctl login ended early: {self._stderr.decode()}"
                self._stderr += chunk
        return url

    def go(self) -> None:
        (self.out / "go").touch()

    async def finish(self) -> tuple[int, str, str]:
        """Its exit status, stdout and stderr."""
        assert self.proc is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        out = b""
        with trio.fail_after(LOGIN_TIMEOUT):
            while chunk := await self.proc.stdout.receive_some():
                out += chunk
            while chunk := await self.proc.stderr.receive_some():
                self._stderr += chunk
            code = await self.proc.wait()
        return code, out.decode(), self._stderr.decode()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()

    def browser_argv(self) -> list[str]:
        argv: list[str] = json.loads((self.out / "argv.json").read_text())
        return argv


async def _daemon(daemon_factory: DaemonFactory, origin: str) -> DaemonProcess:
    return await daemon_factory({NAME: {"type": "http", "url": f"{origin}/mcp"}})


async def attack(other_user: OtherUser, url: str, mode: str) -> dict[str, Any]:
    """Run the attacker as the other uid; what the daemon's listener answered it."""
    script = other_user.script("attacker.py", ATTACKER)
    proc = other_user.popen([SYSTEM_PYTHON, str(script), url, mode], stdout=subprocess.PIPE)
    out, _ = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=STEP_TIMEOUT))
    assert proc.returncode == 0, out
    result: dict[str, Any] = json.loads(out)
    return result


async def owner_get(url: str, account: str | None = None) -> tuple[int | None, dict[str, str]]:
    """One GET from our own uid, following nothing: the status and headers (None: closed
    without an answer)."""
    where = urlsplit(url)
    path = where.path + (f"?{where.query}" if where.query else "")
    extra = f"X-Account: {account}\r\n" if account else ""
    answer = b""
    with trio.fail_after(STEP_TIMEOUT):
        stream = await trio.open_tcp_stream(where.hostname or "127.0.0.1", where.port or 80)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
            try:
                while b"\r\n\r\n" not in answer and (chunk := await stream.receive_some()):
                    answer += chunk
            except trio.BrokenResourceError:
                pass
    if not answer:
        return None, {}
    lines = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split(" ")[1]), {k.lower(): v for k, v in headers.items()}


async def owner_post(url: str) -> None:
    where = urlsplit(url)
    with trio.fail_after(STEP_TIMEOUT):
        stream = await trio.open_tcp_stream(where.hostname or "127.0.0.1", where.port or 80)
        async with stream:
            head = f"POST {where.path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            await stream.send_all(head.encode())
            assert b" 200 " in await stream.receive_some()


async def whoami(daemon: DaemonProcess) -> str:
    """What a session's call of the server's tool answers: whose account it acts on."""
    entry = json.loads(daemon.config_path.read_text())["mcpServers"][NAME]
    settings = daemon.settings_file("session.json", {NAME: entry})
    async with daemon.attach([settings], "caller") as session:
        with trio.fail_after(STEP_TIMEOUT):
            while True:
                tools = [t.name for t in (await session.list_tools()).tools]
                if f"{NAME}__whoami" in tools:
                    break
                await trio.sleep(0.1)
            result = await session.call_tool(f"{NAME}__whoami", {})
    text = result.content[0]
    assert text.type == "text"
    return text.text


def _refused(answer: dict[str, Any]) -> bool:
    """Closed without a byte of answer (unread: a reset, or a plain close)."""
    return answer["answer"] == ""


@pytest.mark.parametrize("mode", ["code", "error"])
async def test_a_callback_from_another_user_is_refused_and_the_owners_login_completes(
    mode: str, daemon_factory: DaemonFactory, other_user: OtherUser, tmp_path: Path
) -> None:
    """(a) a code the attacker got for its own account with the owner's state and challenge,
    (b) an error in the owner's state's name: refused unread; the owner's login completes."""
    async with accounts_server() as origin:
        daemon = await _daemon(daemon_factory, origin)
        login = Login(daemon, tmp_path / "browser")
        try:
            url = await login.start()
            answer = await attack(other_user, url, mode)
            assert _refused(answer), answer
            login.go()
            code, out, err = await login.finish()
        finally:
            login.kill()
        assert code == 0, err
        assert f"{NAME}: authorized" in out
        assert await whoami(daemon) == "account=owner"
        log = daemon.log_path.read_text()
        refusals = [json.loads(line) for line in log.splitlines() if "another user" in line]
        assert refusals, log[-3000:]
        assert refusals[0]["uid"] == other_user.uid
        assert refusals[0]["count"] == 1


async def test_a_wrong_or_reused_state_neither_completes_nor_ends_the_login(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """(c) from the owner's own uid: a callback with another state, and one that reuses the
    state after it completed the redirect (the token request is held meanwhile), are refused
    with an error page; the login completes with the first code, the owner's account."""
    async with accounts_server("--hold-token") as origin:
        daemon = await _daemon(daemon_factory, origin)
        login = Login(daemon, tmp_path / "browser", record_only=True)
        try:
            url = await login.start()
            status, headers = await owner_get(url, "owner")
            assert status == 302
            first = headers["location"]
            status, headers = await owner_get(url, "someone-else")
            assert status == 302
            second = headers["location"]
            where = urlsplit(first)
            wrong = dict(parse_qs(where.query), state=["not-this-login"])
            wrong_url = where._replace(query=urlencode(wrong, doseq=True)).geturl()
            assert (await owner_get(wrong_url))[0] == 400
            assert (await owner_get(first))[0] == 200
            assert (await owner_get(second))[0] == 400  # the state was used
            assert (await owner_get(wrong_url))[0] == 400
            await owner_post(f"{origin}/control/release")
            code, _, err = await login.finish()
        finally:
            login.kill()
        assert code == 0, err
        assert await whoami(daemon) == "account=owner"


async def test_the_browser_is_never_given_the_authorization_url(
    daemon_factory: DaemonFactory, other_user: OtherUser, tmp_path: Path
) -> None:
    """(d) what $BROWSER gets on its command line holds nothing of the authorization URL; it
    is an address that redirects our own uid to that URL and closes another uid's connection
    unread."""
    async with accounts_server() as origin:
        daemon = await _daemon(daemon_factory, origin)
        login = Login(daemon, tmp_path / "browser")
        try:
            url = await login.start()
            with trio.fail_after(STEP_TIMEOUT):
                while not (login.out / "argv.json").exists():
                    await trio.sleep(0.02)
            argv = login.browser_argv()
            query = parse_qs(urlsplit(url).query)
            secrets_of_the_url = [query["state"][0], query["code_challenge"][0], url]
            assert not [a for a in argv[1:] for s in secrets_of_the_url if s in a], argv
            (given,) = argv[1:]
            assert given.startswith("http://127.0.0.1:"), given
            assert urlsplit(given).query == ""
            assert _refused(await attack(other_user, given, "fetch"))
            status, headers = await owner_get(given)
            assert status in (302, 303)
            assert headers["location"] == url
            assert headers["cache-control"] == "no-store"
            login.go()
            code, _, err = await login.finish()
        finally:
            login.kill()
        assert code == 0, err
        assert json.loads((login.out / "browser.json").read_text())["status"] == 200


async def test_an_oauth_failure_reads_as_one_sentence(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """(e) the token endpoint refuses the code (with a multi-line body): daemonctl says so in
    one line naming the server and the step, never an ExceptionGroup's repr."""
    async with accounts_server("--token-fails") as origin:
        daemon = await _daemon(daemon_factory, origin)
        login = Login(daemon, tmp_path / "browser")
        try:
            await login.start()
            login.go()
            code, out, err = await login.finish()
        finally:
            login.kill()
    assert code == 1, out
    (said,) = [line for line in err.splitlines() if line.startswith("daemonctl:")]
    assert f"'{NAME}'" in said
    assert "token request failed" in said
    assert "invalid_grant" in said
    for junk in ("ExceptionGroup", "Exceptions from Trio", "OAuthError(", "Traceback"):
        assert junk not in err, err


async def test_a_discovery_failure_reads_as_one_sentence_in_servers_and_login(
    daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """(e) a server whose metadata names another resource: `daemonctl servers` (and status)
    and `daemonctl login` say so in one sentence naming the server and the step."""
    async with accounts_server("--resource-mismatch") as origin:
        daemon = await _daemon(daemon_factory, origin)
        settings = daemon.settings_file(
            "session.json", {NAME: {"type": "http", "url": f"{origin}/mcp"}}
        )
        async with daemon.attach([settings], "caller"):
            with trio.fail_after(STEP_TIMEOUT):
                while not (errors := [s["last_error"] for s in await daemon.ctl("servers")]):
                    await trio.sleep(0.1)
                while errors[0] is None:
                    await trio.sleep(0.1)
                    errors = [s["last_error"] for s in await daemon.ctl("servers")]
            (not_up,) = (await daemon.ctl("status"))["not_up"]
        login = Login(daemon, tmp_path / "browser")
        try:
            login.proc = await trio.lowlevel.open_process(
                login.argv, env=login.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            code, out, err = await login.finish()
        finally:
            login.kill()
    expected = f"server '{NAME}': OAuth discovery failed: Protected resource {origin}/other"
    assert errors[0].startswith(expected), errors
    assert not_up["last_error"] == errors[0]
    assert code == 1, out
    (said,) = [line for line in err.splitlines() if line.startswith("daemonctl:")]
    assert expected in said, said
    for text in (errors[0], err):
        for junk in ("ExceptionGroup", "Exceptions from Trio", "OAuthError", "stderr:"):
            assert junk not in text, text
