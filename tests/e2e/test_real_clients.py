"""The real-client matrix (issue 13 point 7, issue 28 item 6): Claude Code, Codex, gemini-cli,
Qwen Code, GitHub Copilot CLI, opencode and Cline CLI, each installed from npm
(tools/install-peers.sh, pinned), run one non-interactive agent turn against a fake model API on
127.0.0.1 (fake_model.py) with mcpool as their only MCP server.

The fake model's first reply calls the mcpool tool `up__env` (tools/fake_upstream.py's `env`)
for a variable only the upstream's settings entry holds, a fresh token; its second reply quotes
the tool result. So the token in the client's final output proves the whole path: the tool list
reached the model through the client, the call went client -> `mcpool attach` -> daemon ->
upstream, and the result came back. Each client gets a fresh HOME with its own config that
launches `<venv>/bin/mcpool attach --socket S --settings F` against a private daemon. A client
that defers MCP tools behind its own tool search (Claude Code, Qwen Code) or calls them through a
meta-tool (Qwen Code's `tool_call`) is followed by the fake model as a model would (fake_model.py
Script): nothing here is per client but its setup, so a version bump is a pin change.

Per client the matrix covers: a call end to end; a settings edit while the client runs
(includeTools ["env", "echo"] -> ["env", "pid"], after which the model keeps the conversation
going for a few turns to see whether a later request offers `up__pid`: the clients that re-list
on list_changed must, the others are recorded); a cold start (the client's bridge starts the
daemon, with a fast and a slow upstream) after which the client's exit leaves the daemon up
(Copilot CLI and opencode SIGTERM their MCP server's whole process tree); a 52-character server
name whose names, the client's own prefix included, fit the client's limit and reach the model
whole; two clients sharing one upstream process; and an OAuth server logged in to once with
`daemonctl login`, whose tool the client then calls. Codex, which has no tool search of its
own, also finds one of 300 tools through mcpool's (issue 31) and calls it. The matrix (version,
exposed names, tool search or meta-tool, re-listed or not, mcpool's search, seconds) is printed
at the end of the module's run.

Peers come from $MCPOOL_PEERS_DIR (default: the repo's .peers); a client missing there skips
with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from mcpool.daemon._setup import entry_for

from .fake_model import NAMESPACE_SEP, FakeModel, Script, ToolCall
from .harness import (
    PEERS_DIR,
    DaemonFactory,
    DaemonProcess,
    daemonctl_argv,
    fake_server,
    load_peers,
    run_daemonctl,
)
from .test_oauth_callback import NAME as OAUTH_SERVER
from .test_oauth_callback import Login, accounts_server

pytestmark = [pytest.mark.peers, pytest.mark.slow]

# One agent run: a cold client start (Claude Code, Codex, Copilot CLI, opencode and Cline are
# native; gemini-cli and Qwen Code load ~30 MB bundles under Node), the MCP handshake through
# mcpool, and up to six model turns with their pauses. They take 3-30 s here; 120 s leaves room
# on a loaded 2-core box.
CLIENT_RUN_TIMEOUT = 120.0
# A client's set-up command (`cline auth`): one native start writing one file.
CLIENT_SETUP_TIMEOUT = 60.0
# The daemon re-projects a session's view within milliseconds of a settings file change; this
# bounds the wait for it (the watcher, a reload, one daemonctl round trip per poll).
VIEW_CHANGE_TIMEOUT = 15.0
VIEW_POLL_INTERVAL = 0.2
# A cold upstream as slow as `npx -y some-server` on a warm npm cache: the first tool list a
# client takes must wait for it rather than come back empty.
COLD_UPSTREAM_DELAY = 3.0
# The two clients of the sharing test meet mid-run; the slower one's cold start bounds this.
BARRIER_TIMEOUT = 90.0
# After the client exited, the daemon it started must still answer: one daemonctl round trip.
# A client that kills its server's tree does so as it exits; this leaves its signals time to land.
AFTER_EXIT_SETTLE = 0.5

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")

# What makes a client wait for its MCP servers before its first model request. Without it
# Claude Code -p connects in the background and Codex exec gives servers a short grace: with an
# upstream that takes 3 s to start, both ran the turn without mcpool's tools, silently (issue
# 13's "cold it gets 0 tools"). Codex's is `required = true` on its mcpool entry, set up for
# every test. Claude Code's is this environment, set only where the upstream is slow: with it,
# its re-list after list_changed adds the new tools but keeps the removed ones (without it the
# list is replaced), which the list_changed check would see. The other clients wait by
# themselves.
CLAUDE_WAIT_ENV = {"MCP_CONNECTION_NONBLOCKING": "false", "MCP_CONNECT_TIMEOUT_MS": "60000"}

PROMPT = "Call the mcpool tool I asked for and tell me what it answered."
MCPOOL = str(Path(sys.executable).parent / "mcpool")
MODEL = "fake-model"


@dataclass(frozen=True)
class Setup:
    """What a client's setup function is given."""

    home: Path
    project: Path
    url: str  # the fake model's origin
    attach: list[str]  # mcpool's arguments in the client's entry
    exe: str
    peers: dict[str, str]


@dataclass
class Launch:
    """How to run the client: `before` runs first (each must exit 0), then `argv`."""

    argv: list[str]
    env: dict[str, str]
    before: list[list[str]] = field(default_factory=list)


@dataclass
class Client:
    key: str  # the test id, the session name, and the client's name for mcpool's entry
    name: str
    package: str  # its npm package (the version shown in the matrix is the installed one)
    peer: str  # the PEER_* variable in env.sh
    relists: bool  # re-lists on notifications/tools/list_changed (what issue 13 and 28 found)
    setup: Callable[[Setup], Launch]
    name_limit: int  # the longest tool name it (or its model API) passes on, its prefix included


def _base_env(s: Setup, *, proxy_guard: bool = True) -> dict[str, str]:
    # Nothing of the test's environment beyond PATH: no API keys, proxies or XDG paths leak in.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(s.home),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "LANG": "C.UTF-8",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    if proxy_guard:
        # Anything a client sends beyond the fake model goes to the fake model as its proxy,
        # which refuses it at once, instead of resolving and reaching the outside world: Codex
        # looks up github.com, api.github.com and chatgpt.com otherwise, Cline CLI
        # otel.cline.bot and data.cline.bot.
        env.update(dict.fromkeys(PROXY_VARIABLES, s.url))
    return env


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def setup_claude(s: Setup) -> Launch:
    # User scope, as `mcpool setup-client claude-code --write --scope user` writes it.
    entry = entry_for("claude-code", [MCPOOL, *s.attach])
    _write_json(
        s.home / ".claude.json",
        {"hasCompletedOnboarding": True, "mcpServers": {"mcpool": entry}},
    )
    env = {
        **_base_env(s),
        "ANTHROPIC_BASE_URL": s.url,
        "ANTHROPIC_API_KEY": "dummy",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    # `mcp__mcpool` allows every tool of the server, whatever the prefix of its names.
    return Launch([s.exe, "-p", PROMPT, "--allowedTools", "mcp__mcpool"], env)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def setup_codex(s: Setup) -> Launch:
    codex_home = s.home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        "\n".join(
            [
                f'model = "{MODEL}"',
                'model_provider = "fake"',
                'approval_policy = "never"',
                "check_for_update_on_startup = false",
                "",
                "[model_providers.fake]",
                'name = "fake"',
                f'base_url = "{s.url}/v1"',
                'wire_api = "responses"',
                'env_key = "FAKE_MODEL_API_KEY"',
                "",
                "[mcp_servers.mcpool]",
                f"command = {json.dumps(MCPOOL)}",
                # Wait for mcpool before the first turn (see CLAUDE_WAIT_ENV).
                "required = true",
                f"args = {_toml_list(s.attach)}",
                # Codex asks before an MCP tool call unless told; exec cannot ask, so it fails
                # the call ("requires approval, but approval policy is never").
                'default_tools_approval_mode = "approve"',
                "",
                "[analytics]",
                "enabled = false",
                "",
            ]
        )
    )
    env = {**_base_env(s), "CODEX_HOME": str(codex_home), "FAKE_MODEL_API_KEY": "dummy"}
    return Launch([s.exe, "exec", "--skip-git-repo-check", PROMPT], env)


def _gemini_like_settings(attach: list[str], auth: str) -> dict[str, Any]:
    return {
        "mcpServers": {"mcpool": {"command": MCPOOL, "args": attach}},
        "security": {"auth": {"selectedType": auth}, "folderTrust": {"enabled": True}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "telemetry": {"enabled": False},
    }


def setup_gemini(s: Setup) -> Launch:
    settings = _gemini_like_settings(s.attach, "gemini-api-key")
    _write_json(s.home / ".gemini" / "settings.json", settings)
    _write_json(s.home / ".gemini" / "trustedFolders.json", {str(s.project): "TRUST_FOLDER"})
    env = {
        **_base_env(s),
        "GEMINI_API_KEY": "dummy",
        "GOOGLE_GEMINI_BASE_URL": s.url,
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }
    return Launch([s.exe, "-p", PROMPT, "--yolo", "-m", "gemini-2.5-flash"], env)


def setup_qwen(s: Setup) -> Launch:
    _write_json(s.home / ".qwen" / "settings.json", _gemini_like_settings(s.attach, "openai"))
    _write_json(s.home / ".qwen" / "trustedFolders.json", {str(s.project): "TRUST_FOLDER"})
    env = {
        # Qwen Code sends its model requests through HTTPS_PROXY whatever NO_PROXY says; it
        # makes no other connection (strace, MCPOOL_REAL_CLIENTS_STRACE).
        **_base_env(s, proxy_guard=False),
        "OPENAI_BASE_URL": f"{s.url}/v1",
        "OPENAI_API_KEY": "dummy",
        "OPENAI_MODEL": MODEL,
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
    }
    return Launch([s.exe, "-p", PROMPT, "--yolo"], env)


def setup_copilot(s: Setup) -> Launch:
    # What `mcpool setup-client copilot --write` writes.
    entry = entry_for("copilot", [MCPOOL, *s.attach])
    _write_json(s.home / ".copilot" / "mcp-config.json", {"mcpServers": {"mcpool": entry}})
    env = {
        **_base_env(s),
        # Offline: no GitHub sign-in, telemetry or update checks; the model is the provider.
        "COPILOT_OFFLINE": "true",
        "COPILOT_PROVIDER_BASE_URL": f"{s.url}/v1",
        "COPILOT_PROVIDER_API_KEY": "dummy",
        "COPILOT_MODEL": MODEL,
        "COPILOT_AUTO_UPDATE": "false",
    }
    # The native binary unpacks its 235 MB JavaScript payload into a cache on first start; the
    # one tools/install-peers.sh filled is shared by every run instead of one per HOME.
    cache = s.peers.get("PEER_COPILOT_CACHE")
    if cache:
        env["COPILOT_PKG_CACHE_HOME"] = cache
    return Launch([s.exe, "-p", PROMPT, "--allow-all-tools"], env)


def setup_opencode(s: Setup) -> Launch:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "fake",
                "options": {"baseURL": f"{s.url}/v1", "apiKey": "dummy"},
                "models": {MODEL: {"name": MODEL, "tool_call": True}},
            }
        },
        # What `mcpool setup-client opencode --write` writes.
        "mcp": {"mcpool": entry_for("opencode", [MCPOOL, *s.attach])},
    }
    _write_json(s.home / ".config" / "opencode" / "opencode.json", config)
    env = {
        **_base_env(s),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    }
    return Launch([s.exe, "run", "-m", f"fake/{MODEL}", PROMPT], env)


def setup_cline(s: Setup) -> Launch:
    # Where Cline CLI reads MCP servers (@cline/shared's storage paths), in the shape its own
    # `cline mcp add` writes, as `mcpool setup-client cline --write` does.
    entry = entry_for("cline", [MCPOOL, *s.attach])
    path = s.home / ".cline" / "data" / "settings" / "cline_mcp_settings.json"
    _write_json(path, {"mcpServers": {"mcpool": entry}})
    env = _base_env(s)
    auth = [s.exe, "auth", "-p", "openai", "-k", "dummy", "-m", MODEL, "-b", f"{s.url}/v1"]
    return Launch([s.exe, PROMPT, "--json"], env, before=[auth])


CLIENTS = {
    c.key: c
    for c in (
        Client("claude", "Claude Code", "@anthropic-ai/claude-code", "PEER_CLAUDE", True,
               setup_claude, 64),
        Client("codex", "Codex", "@openai/codex", "PEER_CODEX", False, setup_codex, 64),
        Client("gemini", "gemini-cli", "@google/gemini-cli", "PEER_GEMINI", True,
               setup_gemini, 63),
        Client("qwen", "Qwen Code", "@qwen-code/qwen-code", "PEER_QWEN", False, setup_qwen, 63),
        Client("copilot", "Copilot CLI", "@github/copilot", "PEER_COPILOT", True,
               setup_copilot, 64),
        Client("opencode", "opencode", "opencode-ai", "PEER_OPENCODE", True, setup_opencode, 64),
        Client("cline", "Cline CLI", "cline", "PEER_CLINE", False, setup_cline, 64),
    )
}  # fmt: skip

# Filled by the tests, printed by the module fixture: client key -> facts observed.
MATRIX: dict[str, dict[str, Any]] = {}


def peers_dir() -> Path:
    return Path(os.environ.get("MCPOOL_PEERS_DIR") or PEERS_DIR)


@cache
def client_version(package: str) -> str:
    """The installed version of a client's npm package ("?" when it cannot be read)."""
    manifest = peers_dir() / "clients" / "node_modules" / package / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "?"


def title(client: Client) -> str:
    return f"{client.name} {client_version(client.package)}"


@pytest.fixture(scope="module")
def client_peers(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """env.sh of $MCPOOL_PEERS_DIR (default .peers), installing it when missing; at the end of
    the module, the matrix of what each client did."""
    if os.environ.get("MCPOOL_SKIP_PEERS") == "1":
        pytest.skip("MCPOOL_SKIP_PEERS=1")
    peers = load_peers(peers_dir())
    yield peers
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and MATRIX:
        # Shown whatever -s says: the matrix is the point of running these tests.
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            for line in matrix_lines():
                reporter.write_line(line)


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "-")


def _always_load(row: dict[str, Any]) -> str:
    """What the client did with _meta["anthropic/alwaysLoad"] under tool search."""
    marked, unmarked = row.get("deferred_always_load_True"), row.get("deferred_always_load_False")
    if marked is None:
        return "-"
    if marked:
        return "deferred anyway"
    return "loaded" + (" (else deferred)" if unmarked else "")


def _reached(row: dict[str, Any]) -> str:
    """How the tool reached the model: listed, or behind a search tool (and a meta-tool)."""
    if not row.get("deferred"):
        return "listed" if "deferred" in row else "-"
    how = f"search {row.get('search') or '?'}"
    return f"{how}, {row['meta']}" if row.get("meta") else how


def _mcpool_search(row: dict[str, Any]) -> str:
    """Whether the client found and called a tool through mcpool's own search, and how many of
    mcpool's tools it offered the model then."""
    offered = row.get("mcpool_search")
    if offered is None:
        return "-"
    return f"yes, {offered} tools" if offered else "no"


def matrix_lines() -> list[str]:
    columns = (
        "client", "tool as the model saw it", "how", "re-listed", "alwaysLoad",
        "cold/slow/up", "long", "login", "mcpool search", "s",
    )  # fmt: skip
    widths = (20, 34, 28, 9, 16, 12, 4, 5, 13, 5)
    lines = ["real-client matrix (issues 13, 28):"]
    lines.append(" ".join(f"{c:<{w}}" for c, w in zip(columns, widths, strict=True)).rstrip())
    for key, client in CLIENTS.items():
        row = MATRIX.get(key)
        if row is None:
            continue
        seconds = f"{row['seconds']:.1f}" if "seconds" in row else "-"
        cold = "/".join(_yes_no(row.get(k)) for k in ("cold", "slow", "daemon_up"))
        cells = (
            title(client),
            row.get("exposed") or "-",
            _reached(row),
            _yes_no(row.get("relisted")),
            _always_load(row),
            cold,
            str(row.get("long_name") or "-"),
            _yes_no(row.get("login")),
            _mcpool_search(row),
            seconds,
        )
        lines.append(" ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip())
    return lines


def client_exe(peers: dict[str, str], client: Client) -> str:
    exe = peers.get(client.peer)
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip(
            f"{client.name} not installed ({client.peer} missing from {peers_dir()}/env.sh): "
            "run tools/peers.sh"
        )
    return exe


@pytest.fixture
def exe(key: str, client_peers: dict[str, str]) -> str:
    """The parametrized client's executable; a missing client skips here, outside trio, where
    pytest still shows the reason."""
    return client_exe(client_peers, CLIENTS[key])


# Every client shares an upstream with another in one of these, each pair run at once.
PAIRS = [("claude", "codex"), ("gemini", "qwen"), ("copilot", "opencode"), ("cline", "codex")]


@pytest.fixture
def pair_exes(pair: tuple[str, str], client_peers: dict[str, str]) -> list[str]:
    return [client_exe(client_peers, CLIENTS[key]) for key in pair]


def upstream_settings(
    token: str, spawn_log: Path, include: list[str], **env: str | float
) -> dict[str, Any]:
    entry = fake_server(MCPOOL_TOKEN=token, FAKE_SPAWN_LOG=str(spawn_log), **env)
    return {"up": {**entry, "includeTools": include}}


def wait_for_view(daemon: DaemonProcess, session: str, exposed: str) -> None:
    """Block (in the fake model's thread) until the daemon shows `exposed` to `session`."""
    deadline = time.monotonic() + VIEW_CHANGE_TIMEOUT
    argv = daemonctl_argv(daemon.sock, "tools", session, "--json")
    seen: Any = None
    while time.monotonic() < deadline:
        done = subprocess.run(argv, capture_output=True, env=daemon.env, timeout=10, check=False)
        if done.returncode == 0:
            seen = json.loads(done.stdout)
            if any(row.get("exposed") == exposed for row in seen):
                return
        time.sleep(VIEW_POLL_INTERVAL)
    raise AssertionError(f"{session} never saw {exposed}: {seen}")


@dataclass
class Run:
    client: Client
    model: FakeModel
    script: Script
    stdout: str
    stderr: str
    returncode: int
    seconds: float

    def explain(self) -> str:
        return (
            f"{title(self.client)} exited {self.returncode} in {self.seconds:.1f} s\n"
            f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}\n"
            f"--- model requests\n{self.model.summary()[-6000:]}"
        )


def _traced(argv: list[str], key: str) -> list[str]:
    trace = os.environ.get("MCPOOL_REAL_CLIENTS_STRACE")
    if not trace:
        return argv
    # An audit of the clients' connections (loopback and Unix sockets only, we hope).
    Path(trace).mkdir(parents=True, exist_ok=True)
    log = str(Path(trace) / f"{key}.strace")
    return ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmmsg", "-s", "120", "-o", log,
            *argv]  # fmt: skip


async def run_client(
    client: Client,
    exe: str,
    peers: dict[str, str],
    daemon: DaemonProcess,
    settings: Path,
    tmp_path: Path,
    script: Script,
    extra_env: dict[str, str] | None = None,
    edit: Callable[[Path], None] | None = None,
) -> Run:
    """Run `client` once against a fresh FakeModel; `extra_env` is merged over its environment
    and `edit(home)` may change its config files after setup wrote them."""
    home = tmp_path / f"home-{client.key}"
    project = tmp_path / f"project-{client.key}"
    home.mkdir()
    project.mkdir()
    attach = ["attach", "--socket", str(daemon.sock), "--settings", str(settings)]
    attach += ["--name", client.key]
    with FakeModel(script) as model:
        launch = client.setup(Setup(home, project, model.url, attach, exe, peers))
        env = {**launch.env, **(extra_env or {})}
        for before in launch.before:
            with trio.fail_after(CLIENT_SETUP_TIMEOUT):
                await trio.run_process(
                    before, env=env, cwd=project, stdin=subprocess.DEVNULL, capture_stdout=True
                )
        if edit is not None:
            edit(home)
        started = time.monotonic()
        with trio.fail_after(CLIENT_RUN_TIMEOUT):
            done = await trio.run_process(
                _traced(launch.argv, client.key),
                env=env,
                cwd=project,
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        seconds = time.monotonic() - started
    dump = os.environ.get("MCPOOL_REAL_CLIENTS_DUMP")
    if dump:
        # Every request the client made, for finding out what a new client version sends.
        bodies = [{"path": r.path, "body": r.body} for r in model.requests]
        Path(dump).mkdir(parents=True, exist_ok=True)
        (Path(dump) / f"{client.key}.json").write_text(json.dumps(bodies, indent=1))
    run = Run(
        client,
        model,
        script,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        done.returncode,
        seconds,
    )
    if os.environ.get("MCPOOL_REAL_CLIENTS_VERBOSE") == "1":
        print(run.explain())
    return run


def record(key: str, script: Script, **facts: Any) -> None:
    """How the tool reached the model, into the matrix."""
    row = MATRIX.setdefault(key, {})
    row.update(deferred=script.deferred, search=script.search, meta=script.meta, **facts)
    if script.exposed and not row.get("exposed"):
        row["exposed"] = script.exposed


@pytest.mark.parametrize("key", list(CLIENTS))
async def test_real_client_calls_an_mcpool_tool_end_to_end(
    key: str,
    exe: str,
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    client = CLIENTS[key]
    daemon = await daemon_factory()
    token = f"tok-{uuid.uuid4().hex}"
    spawn_log = tmp_path / "spawns.log"
    settings = daemon.settings_file(
        "settings.json", upstream_settings(token, spawn_log, ["env", "echo"])
    )

    def narrow_to_pid() -> None:
        # Mid-run: the same server with another includeTools; the daemon sends list_changed.
        daemon.settings_file("settings.json", upstream_settings(token, spawn_log, ["env", "pid"]))
        wait_for_view(daemon, client.key, "up__pid")

    script = Script(
        suffix="up__env",
        arguments={"name": "MCPOOL_TOKEN"},
        changed_suffix="up__pid",
        on_first_result=narrow_to_pid,
    )
    run = await run_client(client, exe, client_peers, daemon, settings, tmp_path, script)
    record(key, script, relisted=script.relisted, seconds=run.seconds)
    MATRIX[key]["exposed"] = script.exposed

    assert run.returncode == 0, run.explain()
    # The tools reached the model, under the client's prefix for mcpool's `up__env`.
    assert script.exposed is not None, run.explain()
    assert script.exposed.endswith("up__env"), run.explain()
    # The call reached the upstream through mcpool: only its settings entry knows the token,
    # and one upstream process served it.
    turns = run.model.turns()
    assert any(token in r for t in turns for r in t.results), run.explain()
    assert len(spawn_log.read_text().split()) == 1, spawn_log.read_text()
    # The result came back to the client, which printed the model's quote of it.
    assert token in run.stdout, run.explain()
    if client.relists:
        assert script.relisted, run.explain()
        assert script.exposed_changed is not None
        assert not any(name.endswith("up__echo") for name in script.tool_lists[-1])


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
async def test_two_real_clients_share_one_upstream_process(
    pair: tuple[str, str],
    pair_exes: list[str],
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    clients = [CLIENTS[key] for key in pair]
    daemon = await daemon_factory()
    spawn_log = tmp_path / "spawns.log"
    entry = fake_server(FAKE_SPAWN_LOG=str(spawn_log))
    settings = daemon.settings_file("settings.json", {"up": {**entry, "includeTools": ["pid"]}})
    snapshot: list[Any] = []

    def servers_now() -> None:
        # Both clients hold their first tool result and wait for the model: both attached.
        done = subprocess.run(
            daemonctl_argv(daemon.sock, "servers", "--json"),
            capture_output=True,
            env=daemon.env,
            timeout=10,
            check=True,
        )
        snapshot.append(json.loads(done.stdout))

    barrier = threading.Barrier(len(clients), action=servers_now, timeout=BARRIER_TIMEOUT)

    def meet() -> None:
        barrier.wait()

    scripts = [Script(suffix="up__pid", arguments={}, on_first_result=meet) for _ in clients]
    runs: list[Run] = []

    async def one(client: Client, exe: str, script: Script, where: Path) -> None:
        where.mkdir()
        runs.append(await run_client(client, exe, client_peers, daemon, settings, where, script))

    async with trio.open_nursery() as nursery:
        for i, (client, exe, script) in enumerate(zip(clients, pair_exes, scripts, strict=True)):
            nursery.start_soon(one, client, exe, script, tmp_path / f"client{i}")

    explained = "\n\n".join(run.explain() for run in runs)
    assert all(run.returncode == 0 for run in runs), explained
    (servers,) = snapshot
    assert len(servers) == 1, servers
    (server,) = servers
    assert len(server["refs"]) == 2, servers
    pid = str(server["pid"])
    # Both results (and both final answers) carry that one upstream's pid.
    for run in runs:
        assert any(pid in r for t in run.model.turns() for r in t.results), explained
        assert pid in run.stdout, explained
    assert spawn_log.read_text().split() == [pid]


# Claude Code defers MCP tools behind ToolSearch (by default since 2.1.2xx; ENABLE_TOOL_SEARCH
# turns it on where it is not) unless a tool carries _meta["anthropic/alwaysLoad"], which mcpool
# sets for `"alwaysLoadTools": true`. Qwen Code defers every MCP tool whatever its _meta. Under
# tool search Claude Code sends its first request while MCP servers are still connecting unless
# told to wait (CLAUDE_WAIT_ENV).
TOOL_SEARCH_ENV = {"ENABLE_TOOL_SEARCH": "true", **CLAUDE_WAIT_ENV}


@pytest.mark.parametrize(
    ("key", "always_load"),
    [("claude", True), ("claude", False), ("qwen", True)],
    ids=["claude-alwaysLoad", "claude-deferred", "qwen-alwaysLoad"],
)
async def test_always_load_tools_under_tool_search(
    key: str,
    always_load: bool,
    exe: str,
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    client = CLIENTS[key]
    daemon = await daemon_factory()
    token = f"tok-{uuid.uuid4().hex}"
    servers = upstream_settings(token, tmp_path / "spawns.log", ["env"])
    servers["up"]["alwaysLoadTools"] = always_load
    settings = daemon.settings_file("settings.json", servers)
    script = Script(suffix="up__env", arguments={"name": "MCPOOL_TOKEN"})
    run = await run_client(
        client, exe, client_peers, daemon, settings, tmp_path, script, extra_env=TOOL_SEARCH_ENV
    )
    MATRIX.setdefault(key, {})[f"deferred_always_load_{always_load}"] = script.deferred

    assert run.returncode == 0, run.explain()
    assert token in run.stdout, run.explain()
    if key == "claude":
        # Loaded up front exactly when mcpool marked the tool alwaysLoad.
        assert script.deferred is not always_load, run.explain()
    else:
        assert script.deferred, run.explain()


# mcpool's own tool search (issue 31): a session of a client without a search of its own (Codex)
# whose view holds more than toolSearchTools tools lists only the alwaysLoad ones and mcpool's
# two (mcpool_search_tools, mcpool_call_tool), so the model finds the tool in words and calls it
# through mcpool. The most of mcpool's tools the model may be offered then, whatever the
# upstream's count: the two, and a few alwaysLoad ones (none here).
SEARCH_UPSTREAM_TOOLS = 300
MAX_OFFERED_UNDER_SEARCH = 12


@pytest.mark.parametrize("key", ["codex"])
async def test_codex_finds_and_calls_a_tool_through_mcpool_search(
    key: str,
    exe: str,
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    client = CLIENTS[key]
    daemon = await daemon_factory(daemon={"toolSearch": "auto"})
    settings = daemon.settings_file(
        "settings.json", {"up": fake_server(FAKE_TOOL_COUNT=SEARCH_UPSTREAM_TOOLS)}
    )
    script = Script(suffix="__tool_217", arguments={})
    run = await run_client(client, exe, client_peers, daemon, settings, tmp_path, script)
    explained = f"{run.explain()}\n--- daemon\n{daemon.output()[-6000:]}"
    # The tools the model was offered that came from mcpool: those in the namespace (Codex's
    # one per MCP server) that holds mcpool's search tool.
    namespace = (script.search or "").rpartition(NAMESPACE_SEP)[0]
    offered = [
        [n for n in tools if n.rpartition(NAMESPACE_SEP)[0] == namespace]
        for tools in script.tool_lists
    ]
    MATRIX.setdefault(key, {})["mcpool_search"] = (
        len(offered[0]) if offered and script.meta and "tool_217" in run.stdout else False
    )

    assert run.returncode == 0, explained
    assert script.search is not None, explained
    assert script.search.endswith("mcpool_search_tools"), explained
    assert namespace, explained
    assert offered, explained
    assert all(0 < len(names) <= MAX_OFFERED_UNDER_SEARCH for names in offered), offered
    assert not any(n.endswith("__tool_217") for names in offered for n in names), offered
    # The model searched, then called what the search found through mcpool's call tool.
    calls = [r.reply for r in run.model.requests if isinstance(r.reply, ToolCall)]
    assert [c.name for c in calls] == [script.search, script.meta], explained
    assert script.meta is not None, explained
    assert script.meta.endswith("mcpool_call_tool"), explained
    assert calls[1].arguments.get("name") == script.exposed, explained
    assert script.exposed is not None, explained
    assert script.exposed.endswith("__tool_217"), explained
    # The search's result named the tool, and the call's result is the tool's own answer.
    results = run.model.turns()[-1].results
    assert len(results) == 2, explained
    assert script.exposed in results[0], explained
    assert "tool_217" in results[1], explained
    assert script.exposed not in results[1], explained
    assert "tool_217" in run.stdout, explained


def _trust_mcpool_entry(folder: str) -> Callable[[Path], None]:
    def edit(home: Path) -> None:
        path = home / folder / "settings.json"
        settings = json.loads(path.read_text())
        settings["mcpServers"]["mcpool"]["trust"] = True
        path.write_text(json.dumps(settings, indent=2))

    return edit


@pytest.mark.parametrize("key", ["gemini", "qwen"])
async def test_trusted_mcpool_entry_runs_tools_without_yolo(
    key: str,
    exe: str,
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    """gemini-cli and Qwen Code confirm every MCP tool call unless the client's own entry for
    mcpool says `"trust": true`; non-interactive, unconfirmed tools are hidden (gemini-cli) or
    declined (Qwen Code). mcpool's `_meta["mcpool/trust"]` does not count for either."""
    base = CLIENTS[key]

    def without_yolo(s: Setup) -> Launch:
        launch = base.setup(s)
        launch.argv = [a for a in launch.argv if a != "--yolo"]
        return launch

    client = Client(
        base.key, base.name, base.package, base.peer, base.relists, without_yolo, base.name_limit
    )
    daemon = await daemon_factory()
    token = f"tok-{uuid.uuid4().hex}"
    settings = daemon.settings_file(
        "settings.json", upstream_settings(token, tmp_path / "spawns.log", ["env"])
    )
    script = Script(suffix="up__env", arguments={"name": "MCPOOL_TOKEN"})
    folder = ".gemini" if key == "gemini" else ".qwen"
    run = await run_client(
        client,
        exe,
        client_peers,
        daemon,
        settings,
        tmp_path,
        script,
        edit=_trust_mcpool_entry(folder),
    )
    assert run.returncode == 0, run.explain()
    assert token in run.stdout, run.explain()


async def daemon_answers(sock: Path) -> int:
    """The pid `daemonctl status` reports for the daemon on `sock` (it must answer)."""
    done = await run_daemonctl(sock, "status", "--json")
    pid = json.loads(done.stdout)["pid"]
    assert isinstance(pid, int)
    return pid


@pytest.mark.parametrize("slow", [False, True], ids=["fast-upstream", "slow-upstream"])
@pytest.mark.parametrize("key", list(CLIENTS))
async def test_real_client_starts_the_daemon_cold(
    key: str,
    slow: bool,
    exe: str,
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    """No daemon runs: the client's `mcpool attach` starts one (and the upstream), and the
    first tool list the client takes (Codex and Qwen Code take only one) holds the upstream's
    tools, also when the upstream is slow to start (with CLAUDE_WAIT_ENV for Claude Code and
    Codex's `required = true`, which every test here sets up). A server never seen before is
    waited for at most the startup budget (L6: then late servers come by list_changed, which
    Codex and Qwen Code ignore): a user whose first start is slower raises `startupBudget`
    in the user config, as the slow case does; from then on the stored snapshot answers at once.

    The daemon the client's bridge started outlives the client (X6): Copilot CLI and opencode
    SIGTERM their MCP server's whole process tree as they exit, and the daemon is not in it."""
    client = CLIENTS[key]
    # Not started: the bridge starts it; the factory's teardown still kills what it left.
    daemon = await daemon_factory(start=False)
    token = f"tok-{uuid.uuid4().hex}"
    delay = {"FAKE_STARTUP_DELAY": COLD_UPSTREAM_DELAY} if slow else {}
    settings = daemon.settings_file(
        "settings.json", upstream_settings(token, tmp_path / "spawns.log", ["env"], **delay)
    )
    started: list[int] = []

    def note_daemon() -> None:
        # Mid-run, the daemon the bridge started: its pid, to find it again after the exit.
        done = subprocess.run(
            daemonctl_argv(daemon.sock, "status", "--json"),
            capture_output=True,
            timeout=10,
            check=True,
        )
        started.append(json.loads(done.stdout)["pid"])

    script = Script(
        suffix="up__env", arguments={"name": "MCPOOL_TOKEN"}, on_first_result=note_daemon
    )
    wait = CLAUDE_WAIT_ENV if key == "claude" and slow else None

    def budget(home: Path) -> None:
        # The daemon the bridge starts reads the client user's own mcpool config.
        if slow:
            config = {"daemon": {"startupBudget": COLD_UPSTREAM_DELAY * 4}}
            _write_json(home / ".config" / "mcpool" / "config.json", config)

    run = await run_client(
        client, exe, client_peers, daemon, settings, tmp_path, script, extra_env=wait, edit=budget
    )
    MATRIX.setdefault(key, {})["slow" if slow else "cold"] = token in run.stdout
    assert run.returncode == 0, run.explain()
    assert script.exposed is not None, run.explain()
    assert token in run.stdout, run.explain()
    # The client has exited (and killed what it killed): the same daemon still answers.
    (pid,) = started
    await trio.sleep(AFTER_EXIT_SETTLE)
    assert psutil.pid_exists(pid), run.explain()
    assert await daemon_answers(daemon.sock) == pid
    MATRIX[key]["daemon_up"] = True


# 52 characters (issue 28): `<server>__echo` alone fits 64, but not after any client's own
# prefix (issue 13 saw Claude Code send 77-character names, which the real Anthropic API rejects;
# gemini-cli cut them in the middle, Qwen Code at 63; issue 28 saw opencode send 71, and Copilot
# CLI and Cline re-cut them with their own digests, `whoami` becoming `whoa`).
LONG_SERVER = "atlassian-confluence-enterprise-workspace-eu-west-1a"


@pytest.mark.parametrize("key", list(CLIENTS))
async def test_long_server_names_fit_the_clients_own_limit(
    key: str,
    exe: str,
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    assert len(LONG_SERVER) == 52
    client = CLIENTS[key]
    daemon = await daemon_factory()
    token = f"tok-{uuid.uuid4().hex}"
    settings = daemon.settings_file(
        "settings.json", {LONG_SERVER: {**fake_server(), "includeTools": ["echo"]}}
    )
    # The tool's own name must reach the model whole: a client that re-cut mcpool's name to fit
    # would show something not ending in `__echo`, which the model cannot find.
    script = Script(suffix="__echo", arguments={"text": token})
    run = await run_client(client, exe, client_peers, daemon, settings, tmp_path, script)
    assert run.returncode == 0, run.explain()
    # The name as the model saw it, the client's own prefix included, fits the client's cap
    # (mcpool shortened its part from clientInfo.name), and it still routes to the upstream.
    assert script.exposed is not None, run.explain()
    # Codex offers each server as a Responses namespace: the recorded `namespace/name` is two
    # fields, and the cap is the name's.
    seen = script.exposed.rsplit("/", 1)[-1]
    MATRIX.setdefault(key, {})["long_name"] = len(seen)
    assert len(seen) <= client.name_limit, script.exposed
    assert any(token in r for t in run.model.turns() for r in t.results), run.explain()
    assert token in run.stdout, run.explain()


@pytest.mark.parametrize("key", list(CLIENTS))
async def test_one_daemonctl_login_serves_the_clients_calls(
    key: str,
    exe: str,
    client_peers: dict[str, str],
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    """A remote server behind OAuth (tests/e2e/oauth_server.py), logged in to once with
    `daemonctl login`: the client, which knows nothing of OAuth here, calls its tool through
    mcpool and acts on the account that logged in."""
    client = CLIENTS[key]
    async with accounts_server() as origin:
        entry = {"type": "http", "url": f"{origin}/mcp"}
        daemon = await daemon_factory({OAUTH_SERVER: entry})
        login = Login(daemon, tmp_path / "browser")
        try:
            await login.start()
            login.go()
            code, out, err = await login.finish()
        finally:
            login.kill()
        assert code == 0, (out, err)
        settings = daemon.settings_file("settings.json", {OAUTH_SERVER: entry})
        script = Script(suffix=f"{OAUTH_SERVER}__whoami", arguments={})
        run = await run_client(client, exe, client_peers, daemon, settings, tmp_path, script)
    MATRIX.setdefault(key, {})["login"] = "account=owner" in run.stdout
    assert run.returncode == 0, run.explain()
    assert any("account=owner" in r for t in run.model.turns() for r in t.results), run.explain()
    assert "account=owner" in run.stdout, run.explain()
