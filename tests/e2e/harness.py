"""Helpers for end-to-end tests that start real processes: the daemon, attach bridges, peers.

Everything here is async on trio (pytest-trio, trio_mode) and bounded: each external wait has a
named timeout so a broken daemon fails a test instead of hanging the run. Teardown is
belt-and-braces (SIGKILL plus a psutil sweep) because a leaked upstream outlives pytest and
poisons every later run on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psutil
import trio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import ElicitationFnT, LoggingFnT, MessageHandlerFnT

REPO = Path(__file__).resolve().parents[2]
FAKE_UPSTREAM = REPO / "tools" / "fake_upstream.py"
PEERS_SCRIPT = REPO / "tools" / "peers.sh"
PEERS_DIR = REPO / ".peers"

# A cold daemon imports trio and msgspec and binds one socket; 10 s covers a loaded CI box.
DAEMON_START_TIMEOUT = 10.0
# `daemonctl stop` plus the daemon's bounded drain (L5) and interpreter exit.
DAEMON_STOP_TIMEOUT = 15.0
# One daemonctl round trip is a Python start plus one admin request.
DAEMONCTL_TIMEOUT = 10.0
# Attach = bridge start + attach + initialize; upstream discovery may add a cold spawn.
ATTACH_TIMEOUT = 15.0
# One raw socket message; tests that expect slower answers pass their own timeout.
RAW_RECEIVE_TIMEOUT = 5.0
# SIGKILLed processes are reaped by the kernel promptly; this only bounds the wait.
KILL_REAP_TIMEOUT = 5.0
# The socket appears at an unpredictable moment in another process; there is no event to wait
# on, so the start-up wait polls at this interval (bounded by DAEMON_START_TIMEOUT).
SOCKET_POLL_INTERVAL = 0.01
# The daemon's startupBudget unless a test sets one: a test that lists once right after attaching
# must not depend on how fast a real server starts on a loaded machine (the budget itself, and
# late servers arriving by list_changed, are tests/e2e/test_startup.py's subject).
TEST_STARTUP_BUDGET = 60.0


def fake_server(**env: str | int | float) -> dict[str, Any]:
    """A stdio settings entry for tools/fake_upstream.py with the given FAKE_* environment."""
    return {
        "command": sys.executable,
        "args": [str(FAKE_UPSTREAM)],
        "env": {key: str(value) for key, value in env.items()},
    }


def write_settings(path: Path, servers: dict[str, Any], **extra: Any) -> Path:
    """Write a settings file ({"mcpServers": servers, **extra}) and return its absolute path."""
    path = path.absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, **extra}, indent=2))
    return path


def daemonctl_argv(sock: Path | str, *args: str) -> list[str]:
    # The console script sits next to the interpreter in a venv; the -c form covers a bare
    # interpreter with the package on its path (and keeps argv[0] meaningful for argparse).
    script = Path(sys.executable).parent / "daemonctl"
    if script.exists():
        head = [str(script)]
    else:
        head = [
            sys.executable,
            "-c",
            "import sys; from mcpool.daemon._ctl import main; sys.exit(main())",
        ]
    return [*head, "--socket", str(sock), *args]


class DaemonctlError(Exception):
    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(
            f"{' '.join(argv)} exited {returncode}\n"
            f"stdout: {stdout.strip()}\nstderr: {stderr.strip()}"
        )
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


async def run_daemonctl(
    sock: Path | str, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """Run `daemonctl --socket sock *args`, bounded by DAEMONCTL_TIMEOUT."""
    argv = daemonctl_argv(sock, *args)
    with trio.fail_after(DAEMONCTL_TIMEOUT):
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    if check and done.returncode != 0:
        raise DaemonctlError(argv, done.returncode, done.stdout.decode(), done.stderr.decode())
    return done


async def daemonctl_json(sock: Path | str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Run `daemonctl --socket sock *args --json` and decode its stdout."""
    done = await run_daemonctl(sock, *args, "--json", env=env)
    return json.loads(done.stdout)


def attach_args(sock: Path | str, settings_files: Iterable[Path | str], name: str) -> list[str]:
    """The interpreter arguments of `mcpool attach` (settings paths made absolute)."""
    args = ["-m", "mcpool", "attach", "--socket", str(sock)]
    for settings in settings_files:
        args += ["--settings", os.path.abspath(settings)]
    return [*args, "--name", name]


@asynccontextmanager
async def attached_session(
    sock: Path | str,
    settings_files: Iterable[Path | str],
    name: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    message_handler: MessageHandlerFnT | None = None,
    logging_callback: LoggingFnT | None = None,
    elicitation_callback: ElicitationFnT | None = None,
    errlog: TextIO = sys.stderr,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> AsyncIterator[ClientSession]:
    """An initialized SDK ClientSession speaking to the daemon through a real `mcpool attach`
    run by `python` (`extra_args` go after its own)."""
    params = StdioServerParameters(
        command=python,
        args=[*attach_args(sock, settings_files, name), *extra_args],
        env=env,
        cwd=cwd,
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(
            read,
            write,
            message_handler=message_handler,
            logging_callback=logging_callback,
            elicitation_callback=elicitation_callback,
        ) as session,
    ):
        with trio.fail_after(ATTACH_TIMEOUT):
            await session.initialize()
        yield session


class RawSocketClient:
    """Newline-delimited JSON on the daemon's Unix socket, for protocol-level tests.

    `receive()` returns the next message whatever it is; `request()` sends a request and
    returns its response, keeping the notifications and server requests that arrived first in
    `self.backlog` (in order) so a test can still assert on them. Each receive is bounded by
    `receive_timeout`; a test expecting a slow answer raises it.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.receive_timeout = RAW_RECEIVE_TIMEOUT
        self.backlog: list[dict[str, Any]] = []
        self._buffer = bytearray()
        self._next_id = 1

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_raw(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        """Send bytes as they are: malformed or oversized lines, partial writes."""
        await self.stream.send_all(data)

    async def receive_line(self) -> bytes | None:
        """The next line without its newline, or None when the peer closed the connection."""
        with trio.fail_after(self.receive_timeout):
            while (end := self._buffer.find(b"\n")) < 0:
                chunk = await self.stream.receive_some()
                if not chunk:
                    return None
                self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    async def receive(self) -> dict[str, Any]:
        line = await self.receive_line()
        if line is None:
            raise EOFError("the daemon closed the connection")
        message = json.loads(line)
        assert isinstance(message, dict), message
        return message

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request with a fresh id; return the whole response (result or error)."""
        request_id = self._next_id
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        with trio.fail_after(self.receive_timeout):
            while True:
                received = await self.receive()
                if received.get("id") == request_id and "method" not in received:
                    return received
                self.backlog.append(received)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)

    async def aclose(self) -> None:
        await self.stream.aclose()


@asynccontextmanager
async def raw_socket_client(sock: Path | str) -> AsyncIterator[RawSocketClient]:
    stream = await trio.open_unix_socket(str(sock))
    client = RawSocketClient(stream)
    try:
        yield client
    finally:
        await client.aclose()


@dataclass
class DaemonProcess:
    """One daemon under test, with its own socket, config, state and log files.

    Files live in `root` (under pytest's tmp_path); the socket lives in a short directory
    under /tmp because AF_UNIX paths are limited to 107 bytes.
    """

    root: Path
    sock: Path
    config_path: Path
    env: dict[str, str]
    process: trio.Process | None = None
    # The interpreter that runs `mcpool daemon` and `mcpool attach`: the test's own unless a test
    # installs mcpool elsewhere (tests/e2e/test_plain_install.py).
    python: str = sys.executable
    _stderr: Any = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        assert self.process is not None, "daemon not started"
        return self.process.pid

    @property
    def stderr_path(self) -> Path:
        return self.root / "daemon.stderr"

    @property
    def log_path(self) -> Path:
        """The daemon's own log file (daemon/_paths.py: state_dir()/daemon.log)."""
        return Path(self.env["XDG_STATE_HOME"]) / "mcpool" / "daemon.log"

    def output(self) -> str:
        """The daemon's stderr plus its log file, for assertion messages."""
        parts = []
        for path in (self.stderr_path, self.log_path):
            with suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')}")
        return "\n".join(parts)

    def write_config(
        self, servers: dict[str, Any] | None = None, daemon: dict[str, Any] | None = None
    ) -> Path:
        """(Re)write the daemon's config file; a running daemon sees it through its watcher."""
        daemon = {"startupBudget": TEST_STARTUP_BUDGET, **(daemon or {})}
        return write_settings(self.config_path, servers or {}, daemon=daemon)

    def settings_file(self, name: str, servers: dict[str, Any]) -> Path:
        """Write a session settings file ({"mcpServers": servers}) under this daemon's root."""
        return write_settings(self.root / name, servers)

    def argv(self) -> list[str]:
        return [
            self.python, "-m", "mcpool", "daemon",
            "--socket", str(self.sock), "--config", str(self.config_path),
        ]  # fmt: skip

    async def start(self) -> None:
        """Start the daemon and wait until its socket accepts a connection."""
        self._stderr = self.stderr_path.open("wb")
        self.process = await trio.lowlevel.open_process(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
            env=self.env,
            cwd=self.root,
        )
        try:
            with trio.fail_after(DAEMON_START_TIMEOUT):
                await self._wait_accepting()
        except trio.TooSlowError:
            raise AssertionError(
                f"daemon socket {self.sock} not accepting after {DAEMON_START_TIMEOUT} s\n"
                + self.output()
            ) from None

    async def _wait_accepting(self) -> None:
        assert self.process is not None
        while True:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"daemon exited with {self.process.returncode} before accepting\n"
                    + self.output()
                )
            try:
                stream = await trio.open_unix_socket(str(self.sock))
            except OSError:
                await trio.sleep(SOCKET_POLL_INTERVAL)
                continue
            await stream.aclose()
            return

    async def stop(self) -> int:
        """`daemonctl --socket sock stop`, then wait for the daemon to exit; its exit code."""
        assert self.process is not None
        await run_daemonctl(self.sock, "stop", env=self.env)
        with trio.fail_after(DAEMON_STOP_TIMEOUT):
            return await self.process.wait()

    async def ctl(self, *args: str) -> Any:
        """daemonctl_json against this daemon."""
        return await daemonctl_json(self.sock, *args, env=self.env)

    def attach(
        self, settings_files: Iterable[Path | str], name: str, **kwargs: Any
    ) -> AbstractAsyncContextManager[ClientSession]:
        """attached_session with this daemon's environment, run from `root` by default."""
        kwargs.setdefault("env", self.attach_env())
        kwargs.setdefault("cwd", self.root)
        kwargs.setdefault("python", self.python)
        return attached_session(self.sock, settings_files, name, **kwargs)

    def attach_env(self) -> dict[str, str]:
        # Only what mcpool reads: stdio_client merges this over a minimal default env.
        keys = (
            "MCPOOL_SOCKET",
            "XDG_STATE_HOME",
            "XDG_CONFIG_HOME",
            "XDG_CACHE_HOME",
            "XDG_RUNTIME_DIR",
        )
        return {key: self.env[key] for key in keys if key in self.env}

    def raw(self) -> AbstractAsyncContextManager[RawSocketClient]:
        return raw_socket_client(self.sock)

    def close_files(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _mentions(proc: psutil.Process, needles: Sequence[str]) -> bool:
    try:
        text = " ".join(proc.cmdline())
        if any(needle in text for needle in needles):
            return True
        environ = proc.environ()
    except (psutil.Error, OSError):
        return False
    return any(needle in value for value in environ.values() for needle in needles)


def kill_leftovers(roots: Iterable[int], needles: Sequence[str]) -> list[int]:
    """SIGKILL the given pids, their descendants, and any process mentioning a needle.

    Descendants are collected before anything dies: once a parent is gone its children are
    reparented and only the environment/cmdline sweep can still find them. Returns the pids
    killed (the test process and its ancestors are never touched).
    """
    spared = {os.getpid()}
    with suppress(psutil.Error):
        spared |= {p.pid for p in psutil.Process().parents()}
    victims: dict[int, psutil.Process] = {}
    for pid in roots:
        with suppress(psutil.Error):
            proc = psutil.Process(pid)
            victims[pid] = proc
            for child in proc.children(recursive=True):
                victims[child.pid] = child
    for proc in psutil.process_iter():
        if proc.pid not in spared and proc.pid not in victims and _mentions(proc, needles):
            victims[proc.pid] = proc
    targets = [proc for pid, proc in victims.items() if pid not in spared]
    for proc in targets:
        with suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    # Orphans may stay zombies here (PID 1 of a sandbox need not reap): a zombie is gone for us,
    # so poll for "not running or zombie" rather than psutil.wait_procs, which waits for reaping.
    deadline = time.monotonic() + KILL_REAP_TIMEOUT
    while time.monotonic() < deadline and any(_running(p) for p in targets):
        time.sleep(0.01)
    return [proc.pid for proc in targets]


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class DaemonFactory:
    """Starts daemons for one test and guarantees nothing they spawned survives it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.daemons: list[DaemonProcess] = []
        self._sock_dirs: list[Path] = []

    async def __call__(
        self,
        servers: dict[str, Any] | None = None,
        *,
        daemon: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        start: bool = True,
        python: str = sys.executable,
    ) -> DaemonProcess:
        """A daemon whose config holds `servers` and `daemon` options, started unless told not.

        `env` is merged over the daemon's environment (the test's, minus MCPOOL_* variables).
        """
        root = self.tmp_path / f"daemon{len(self.daemons)}"
        root.mkdir()
        sock_dir = Path(tempfile.mkdtemp(prefix="mcp"))
        self._sock_dirs.append(sock_dir)
        sock = sock_dir / "daemon.sock"
        base = {k: v for k, v in os.environ.items() if not k.startswith("MCPOOL_")}
        daemon_env = {
            **base,
            "MCPOOL_SOCKET": str(sock),
            "XDG_STATE_HOME": str(root / "state"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_CACHE_HOME": str(root / "cache"),
            **(env or {}),
        }
        process = DaemonProcess(
            root=root,
            sock=sock,
            # The XDG default location, so a lookup that ignores --config still finds it.
            config_path=root / "config" / "mcpool" / "config.json",
            env=daemon_env,
            python=python,
        )
        process.write_config(servers, daemon)
        self.daemons.append(process)
        if start:
            await process.start()
        return process

    async def aclose(self) -> None:
        roots = [d.process.pid for d in self.daemons if d.process and d.process.poll() is None]
        needles = [str(self.tmp_path), *(str(d) for d in self._sock_dirs)]
        kill_leftovers(roots, needles)
        for d in self.daemons:
            if d.process is not None:
                with trio.move_on_after(KILL_REAP_TIMEOUT):
                    await d.process.wait()
            d.close_files()
        for sock_dir in self._sock_dirs:
            shutil.rmtree(sock_dir, ignore_errors=True)


def parse_env_sh(path: Path) -> dict[str, str]:
    """The `export NAME=value` lines of a peers env.sh (install.sh writes no quoting)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            name, _, value = line.removeprefix("export ").partition("=")
            env[name.strip()] = value.strip().strip("'\"")
    return env


def load_peers(peers_dir: Path = PEERS_DIR) -> dict[str, str]:
    """Install the third-party peers when missing (tools/peers.sh) and return env.sh's values."""
    env_sh = peers_dir / "env.sh"
    if not env_sh.exists():
        subprocess.run([str(PEERS_SCRIPT), str(peers_dir)], check=True)
    return parse_env_sh(env_sh)
