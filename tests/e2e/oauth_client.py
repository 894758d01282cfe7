"""The client the conformance suite runs for its auth scenarios: mcpool, as a user drives it.

`conformance client --command "python oauth_client.py" --scenario auth/...` starts the suite's
authorization and MCP servers and runs this with the MCP server's URL as the last argument
(`MCP_CONFORMANCE_SCENARIO` names the scenario, `MCP_CONFORMANCE_CONTEXT` carries pre-registered
credentials). This starts a private daemon (temporary HOME, socket and config whose one upstream
is that URL), attaches one session through `mcpool attach` (the SDK's client), and then does what
a user does: while `daemonctl servers` says `needs-login`, runs `daemonctl login conf` with
`$BROWSER` set to a small command that fetches the URL and follows its redirects (so the
redirect reaches the daemon's loopback listener); waits for the server's tools to reach the
session; calls one; and logs in again when the call says a new login is needed (step-up).

Everything the daemon and daemonctl printed or logged is copied to `$MCPOOL_OAUTH_ARTIFACTS`
(when set) so the test can check that no token appears in any of it. Exit 0 when the tool call
succeeded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
from mcp import ClientSession, StdioServerParameters, stdio_client

NAME = "conf"
STEP_TIMEOUT = 20.0  # one state change or tool listing through the daemon; a hang is a failure
POLL = 0.1
MAX_LOGINS = 6  # more than the daemon's own step-up bound: the daemon must be the one to stop
CIMD_URL = "https://conformance-test.local/client-metadata.json"

BROWSER = """#!{python}
import sys, urllib.request
# A browser that approves at once: fetch what daemonctl gives it (the daemon's loopback
# address, which redirects to the authorization URL) and follow the redirects back to it.
with urllib.request.urlopen(sys.argv[1], timeout=30) as resp:
    resp.read()
"""


def _log(text: str) -> None:
    sys.stderr.write(f"[oauth_client] {text}\n")
    sys.stderr.flush()


class Run:
    def __init__(self, url: str) -> None:
        self.url = url
        self.tmp = Path(tempfile.mkdtemp(prefix="mcpool-oauth-"))
        self.sock = self.tmp / "run" / "daemon.sock"
        self.config = self.tmp / "config.json"
        self.transcript: list[str] = []
        self.facts: dict[str, Any] = {"tools_list_changed": 0}
        scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
        oauth: dict[str, Any] = {}
        if context.get("client_id"):
            oauth["clientId"] = context["client_id"]
            if context.get("client_secret"):
                oauth["clientSecret"] = context["client_secret"]
        if scenario == "auth/basic-cimd":
            oauth["clientMetadataUrl"] = CIMD_URL
        entry: dict[str, Any] = {"type": "http", "url": url}
        if oauth:
            entry["oauth"] = oauth
        self.config.write_text(json.dumps({"mcpServers": {NAME: entry}}))
        browser = self.tmp / "browser"
        browser.write_text(BROWSER.format(python=sys.executable))
        browser.chmod(0o755)
        self.env = {
            **os.environ,
            "HOME": str(self.tmp),
            "XDG_STATE_HOME": str(self.tmp / "state"),
            "XDG_CONFIG_HOME": str(self.tmp / "xdg-config"),
            "XDG_RUNTIME_DIR": str(self.tmp / "run"),
            "MCPOOL_SOCKET": str(self.sock),
            "MCPOOL_CONFIG": str(self.config),
            "BROWSER": str(browser),
        }
        (self.tmp / "run").mkdir(mode=0o700)

    def ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("daemonctl")), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.transcript.append(f"$ daemonctl {' '.join(args)} -> {proc.returncode}")
        self.transcript.append(proc.stdout)
        self.transcript.append(proc.stderr)
        return proc

    def state(self) -> str | None:
        proc = self.ctl("servers", "--json")
        if proc.returncode != 0:
            return None
        for server in json.loads(proc.stdout or "[]"):
            if server.get("name") == NAME:
                return str(server.get("state"))
        return None

    async def wait_state(self) -> str | None:
        """The entry's state once it has settled (not spawning or restarting)."""
        state = None
        with trio.move_on_after(STEP_TIMEOUT):
            while True:
                state = await trio.to_thread.run_sync(self.state)
                if state in ("needs-login", "active", "crash-loop", "failed"):
                    return state
                # A server that cannot be used at all shows restarting with its error.
                await trio.sleep(POLL)
        return state

    async def login(self) -> bool:
        proc = await trio.to_thread.run_sync(lambda: self.ctl("login", NAME, "--json", timeout=90))
        _log(f"login: {proc.returncode} {proc.stdout.strip()} {proc.stderr.strip()}")
        return proc.returncode == 0

    async def tool(self, session: ClientSession) -> str | None:
        """The server's tool once the session has it; None when the server wants a login
        again (or never offers it)."""
        with trio.move_on_after(STEP_TIMEOUT):
            while True:
                tools = (await session.list_tools()).tools
                for tool in tools:
                    if tool.name.endswith("test-tool"):
                        return tool.name
                if await trio.to_thread.run_sync(self.state) in ("needs-login", "failed"):
                    return None
                await trio.sleep(POLL)
        return None

    async def drive(self) -> bool:
        daemon_log = open(self.tmp / "daemon.stderr", "w")  # noqa: SIM115 - closed in finally
        daemon = subprocess.Popen(
            [sys.executable, "-m", "mcpool", "daemon", "--log-level", "debug"],
            env=self.env,
            stdout=daemon_log,
            stderr=subprocess.STDOUT,
        )
        try:
            with trio.fail_after(STEP_TIMEOUT):
                while not self.sock.exists():
                    await trio.sleep(POLL)
            params = StdioServerParameters(
                command=sys.executable, args=["-m", "mcpool", "attach"], env=self.env
            )
            async with (
                stdio_client(params) as (read, write),
                ClientSession(read, write, message_handler=self.message) as session,
            ):
                with trio.fail_after(STEP_TIMEOUT):
                    await session.initialize()
                ok = await self.use(session)
                if ok:
                    await trio.to_thread.run_sync(self.logout)
                return ok
        finally:
            self.ctl("stop")
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            daemon_log.close()
            self.keep()

    async def message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.facts["tools_list_changed"] += 1

    def logout(self) -> None:
        """`daemonctl logout` forgets the tokens; the server wants a login again."""
        store = self.tmp / "state" / "mcpool" / "oauth"
        self.facts["records_before_logout"] = len(list(store.glob("*.json")))
        self.facts["modes"] = {p.name: oct(p.stat().st_mode & 0o777) for p in store.glob("*.json")}
        proc = self.ctl("logout", NAME, "--json")
        self.facts["logout"] = proc.returncode == 0 and json.loads(proc.stdout).get("removed")
        self.facts["records_after_logout"] = len(list(store.glob("*.json")))

    async def use(self, session: ClientSession) -> bool:
        for _ in range(MAX_LOGINS):
            state = await self.wait_state()
            _log(f"state: {state}")
            if state == "needs-login" and not await self.login():
                return False
            if state not in ("needs-login", "active"):
                proc = self.ctl("servers", "--json")
                _log(f"servers: {proc.stdout}")
                return False
            name = await self.tool(session)
            _log(f"tool: {name}")
            if name is None:
                continue
            try:
                with trio.fail_after(STEP_TIMEOUT):
                    result = await session.call_tool(name, {})
            except Exception as exc:
                _log(f"call failed: {exc}")
                if "login" in str(exc).lower():
                    continue
                return False
            _log(f"call: error={result.is_error}")
            return not result.is_error
        return False

    def keep(self) -> None:
        """Copy what the daemon and daemonctl said where the test looks for leaked tokens."""
        out = os.environ.get("MCPOOL_OAUTH_ARTIFACTS")
        if out:
            dest = Path(out)
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "daemonctl.txt").write_text("\n".join(self.transcript))
            for path in [self.tmp / "daemon.stderr", *(self.tmp / "state").rglob("*.log*")]:
                if path.is_file():
                    shutil.copy(path, dest / path.name)
            (dest / "facts.json").write_text(json.dumps(self.facts))
        shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> int:
    run = Run(sys.argv[-1])
    began = time.monotonic()
    ok = trio.run(run.drive)
    _log(f"{'ok' if ok else 'FAILED'} in {time.monotonic() - began:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
