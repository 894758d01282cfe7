"""The real-client matrix (issue 13 point 7): Claude Code, Codex, gemini-cli and Qwen Code, each
installed from npm (tools/install-peers.sh, pinned), run one non-interactive agent turn against a
fake model API on 127.0.0.1 (fake_model.py) with mcpool as their only MCP server.

The fake model's first reply calls the mcpool tool `up__env` (tools/fake_upstream.py's `env`)
for a variable only the upstream's settings entry holds, a fresh token; its second reply quotes
the tool result. So the token in the client's final output proves the whole path: the tool list
reached the model through the client, the call went client -> `mcpool attach` -> daemon ->
upstream, and the result came back. Each client gets a fresh HOME with its own config that
launches `<venv>/bin/mcpool attach --socket S --settings F` against a private daemon.

For every client, after the first result the settings file is rewritten (includeTools
["env", "echo"] -> ["env", "pid"]) and the model keeps the conversation going for a few turns to
see whether a later request offers `up__pid`: the clients that re-list on list_changed must; the
others are recorded. The matrix (exposed names, re-listed or not, seconds) is printed at the end
of the module's run.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from .fake_model import FakeModel, Script
from .harness import (
    PEERS_DIR,
    DaemonFactory,
    DaemonProcess,
    daemonctl_argv,
    fake_server,
    load_peers,
)

pytestmark = [pytest.mark.peers, pytest.mark.slow]

# One agent run: a cold client start (Claude Code and Codex are native; gemini-cli and Qwen Code
# load ~30 MB bundles under Node), the MCP handshake through mcpool, and up to six model turns
# with their pauses. They take 5-30 s here; 120 s leaves room on a loaded 2-core box.
CLIENT_RUN_TIMEOUT = 120.0
# The daemon re-projects a session's view within milliseconds of a settings file change; this
# bounds the wait for it (the watcher, a reload, one daemonctl round trip per poll).
VIEW_CHANGE_TIMEOUT = 15.0
VIEW_POLL_INTERVAL = 0.2
# A cold upstream as slow as `npx -y some-server` on a warm npm cache: the first tool list a
# client takes must wait for it rather than come back empty.
COLD_UPSTREAM_DELAY = 3.0
# The two clients of the sharing test meet mid-run; the slower one's cold start bounds this.
BARRIER_TIMEOUT = 90.0

# Port 9 (discard) on loopback: nothing listens there, so a proxied request fails at once.
DEAD_PROXY = "http://127.0.0.1:9"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")

# What makes a client wait for its MCP servers before its first model request. Without it
# Claude Code -p connects in the background and Codex exec gives servers a short grace: with an
# upstream that takes 3 s to start, both ran the turn without mcpool's tools, silently (issue
# 13's "cold it gets 0 tools"). Codex's is `required = true` on its mcpool entry, set up for
# every test. Claude Code's is this environment, set only where the upstream is slow: with it,
# its re-list after list_changed adds the new tools but keeps the removed ones (without it the
# list is replaced), which the list_changed check would see. gemini-cli and Qwen Code wait by
# themselves.
CLAUDE_WAIT_ENV = {"MCP_CONNECTION_NONBLOCKING": "false", "MCP_CONNECT_TIMEOUT_MS": "60000"}

PROMPT = "Call the mcpool env tool for MCPOOL_TOKEN and tell me what it answered."
MCPOOL = str(Path(sys.executable).parent / "mcpool")


@dataclass
class Client:
    key: str  # the test id, the session name, and the client's name for mcpool's entry
    title: str
    peer: str  # the PEER_* variable in env.sh
    relists: bool  # re-lists on notifications/tools/list_changed (issue 13's finding)
    setup: Callable[[Path, Path, str, list[str], str], tuple[list[str], dict[str, str]]]


def _base_env(home: Path, *, proxy_guard: bool = True) -> dict[str, str]:
    # Nothing of the test's environment beyond PATH: no API keys, proxies or XDG paths leak in.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "LANG": "C.UTF-8",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    if proxy_guard:
        # Anything a client sends beyond the fake model goes to a closed loopback port (a
        # proxy that refuses) instead of resolving and reaching the outside world: Codex looks
        # up github.com, api.github.com and chatgpt.com otherwise.
        env.update(dict.fromkeys(PROXY_VARIABLES, DEAD_PROXY))
    return env


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def setup_claude(
    home: Path, project: Path, url: str, attach: list[str], exe: str
) -> tuple[list[str], dict[str, str]]:
    # User scope, as `claude mcp add -s user mcpool -- mcpool attach ...` writes it.
    _write_json(
        home / ".claude.json",
        {
            "hasCompletedOnboarding": True,
            "mcpServers": {"mcpool": {"type": "stdio", "command": MCPOOL, "args": attach}},
        },
    )
    env = {
        **_base_env(home),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "dummy",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    # `mcp__mcpool` allows every tool of the server, whatever the prefix of its names.
    return [exe, "-p", PROMPT, "--allowedTools", "mcp__mcpool"], env


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def setup_codex(
    home: Path, project: Path, url: str, attach: list[str], exe: str
) -> tuple[list[str], dict[str, str]]:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        "\n".join(
            [
                'model = "fake-model"',
                'model_provider = "fake"',
                'approval_policy = "never"',
                "check_for_update_on_startup = false",
                "",
                "[model_providers.fake]",
                'name = "fake"',
                f'base_url = "{url}/v1"',
                'wire_api = "responses"',
                'env_key = "FAKE_MODEL_API_KEY"',
                "",
                "[mcp_servers.mcpool]",
                f"command = {json.dumps(MCPOOL)}",
                # Wait for mcpool before the first turn (see CLAUDE_WAIT_ENV).
                "required = true",
                f"args = {_toml_list(attach)}",
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
    env = {**_base_env(home), "CODEX_HOME": str(codex_home), "FAKE_MODEL_API_KEY": "dummy"}
    return [exe, "exec", "--skip-git-repo-check", PROMPT], env


def _gemini_like_settings(attach: list[str], auth: str) -> dict[str, Any]:
    return {
        "mcpServers": {"mcpool": {"command": MCPOOL, "args": attach}},
        "security": {"auth": {"selectedType": auth}, "folderTrust": {"enabled": True}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "telemetry": {"enabled": False},
    }


def setup_gemini(
    home: Path, project: Path, url: str, attach: list[str], exe: str
) -> tuple[list[str], dict[str, str]]:
    _write_json(home / ".gemini" / "settings.json", _gemini_like_settings(attach, "gemini-api-key"))
    _write_json(home / ".gemini" / "trustedFolders.json", {str(project): "TRUST_FOLDER"})
    env = {
        **_base_env(home),
        "GEMINI_API_KEY": "dummy",
        "GOOGLE_GEMINI_BASE_URL": url,
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }
    return [exe, "-p", PROMPT, "--yolo", "-m", "gemini-2.5-flash"], env


def setup_qwen(
    home: Path, project: Path, url: str, attach: list[str], exe: str
) -> tuple[list[str], dict[str, str]]:
    _write_json(home / ".qwen" / "settings.json", _gemini_like_settings(attach, "openai"))
    _write_json(home / ".qwen" / "trustedFolders.json", {str(project): "TRUST_FOLDER"})
    env = {
        # Qwen Code sends its model requests through HTTPS_PROXY whatever NO_PROXY says; it
        # makes no other connection (strace, MCPOOL_REAL_CLIENTS_STRACE).
        **_base_env(home, proxy_guard=False),
        "OPENAI_BASE_URL": f"{url}/v1",
        "OPENAI_API_KEY": "dummy",
        "OPENAI_MODEL": "fake-model",
    }
    return [exe, "-p", PROMPT, "--yolo"], env


CLIENTS = {
    c.key: c
    for c in (
        Client("claude", "Claude Code 2.1.197", "PEER_CLAUDE", True, setup_claude),
        Client("codex", "Codex 0.171.0", "PEER_CODEX", False, setup_codex),
        Client("gemini", "gemini-cli 0.61.0", "PEER_GEMINI", True, setup_gemini),
        Client("qwen", "Qwen Code 0.15.10", "PEER_QWEN", False, setup_qwen),
    )
}

# Filled by the tests, printed by the module fixture: client key -> facts observed.
MATRIX: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def client_peers(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """env.sh of $MCPOOL_PEERS_DIR (default .peers), installing it when missing; at the end of
    the module, the matrix of what each client did."""
    if os.environ.get("MCPOOL_SKIP_PEERS") == "1":
        pytest.skip("MCPOOL_SKIP_PEERS=1")
    peers = load_peers(Path(os.environ.get("MCPOOL_PEERS_DIR") or PEERS_DIR))
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


def matrix_lines() -> list[str]:
    columns = (
        "client", "tool as the model saw it", "deferred", "re-listed", "alwaysLoad",
        "cold/slow", "s",
    )  # fmt: skip
    widths = (20, 26, 9, 10, 23, 10, 5)
    lines = ["real-client matrix (issue 13):"]
    lines.append(" ".join(f"{c:<{w}}" for c, w in zip(columns, widths, strict=True)).rstrip())
    for key, client in CLIENTS.items():
        row = MATRIX.get(key)
        if row is None:
            continue
        seconds = f"{row['seconds']:.1f}" if "seconds" in row else "-"
        cells = (
            client.title,
            row.get("exposed") or "-",
            _yes_no(row.get("deferred")),
            _yes_no(row.get("relisted")),
            _always_load(row),
            f"{_yes_no(row.get('cold'))}/{_yes_no(row.get('slow'))}",
            seconds,
        )
        lines.append(" ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip())
    return lines


def client_exe(peers: dict[str, str], client: Client) -> str:
    exe = peers.get(client.peer)
    if not exe or not os.access(exe, os.X_OK):
        peers_dir = os.environ.get("MCPOOL_PEERS_DIR") or PEERS_DIR
        pytest.skip(
            f"{client.title} not installed ({client.peer} missing from {peers_dir}/env.sh): "
            "run tools/peers.sh"
        )
    return exe


@pytest.fixture
def exe(key: str, client_peers: dict[str, str]) -> str:
    """The parametrized client's executable; a missing client skips here, outside trio, where
    pytest still shows the reason."""
    return client_exe(client_peers, CLIENTS[key])


PAIR = ("claude", "codex")


@pytest.fixture
def pair_exes(client_peers: dict[str, str]) -> list[str]:
    return [client_exe(client_peers, CLIENTS[key]) for key in PAIR]


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
            f"{self.client.title} exited {self.returncode} in {self.seconds:.1f} s\n"
            f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}\n"
            f"--- model requests\n{self.model.summary()}"
        )


async def run_client(
    client: Client,
    exe: str,
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
        argv, env = client.setup(home, project, model.url, attach, exe)
        env.update(extra_env or {})
        trace = os.environ.get("MCPOOL_REAL_CLIENTS_STRACE")
        if trace:
            # An audit of the clients' connections (loopback and Unix sockets only, we hope).
            Path(trace).mkdir(parents=True, exist_ok=True)
            log = str(Path(trace) / f"{client.key}.strace")
            argv = [
                "strace",
                "-f",
                "-qq",
                "-e",
                "trace=connect,sendto,sendmmsg",
                "-s",
                "120",
                "-o",
                log,
                *argv,
            ]
        if edit is not None:
            edit(home)
        started = time.monotonic()
        with trio.fail_after(CLIENT_RUN_TIMEOUT):
            done = await trio.run_process(
                argv,
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
    return Run(
        client,
        model,
        script,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        done.returncode,
        seconds,
    )


@pytest.mark.parametrize("key", list(CLIENTS))
async def test_real_client_calls_an_mcpool_tool_end_to_end(
    key: str, exe: str, daemon_factory: DaemonFactory, tmp_path: Path
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
    run = await run_client(client, exe, daemon, settings, tmp_path, script)
    MATRIX[key] = {
        "exposed": script.exposed,
        "exposed_changed": script.exposed_changed,
        "relisted": script.relisted,
        "deferred": script.deferred,
        "seconds": run.seconds,
    }
    print("\n".join(matrix_lines()))
    if os.environ.get("MCPOOL_REAL_CLIENTS_VERBOSE") == "1":
        print(run.explain())

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


async def test_two_real_clients_share_one_upstream_process(
    pair_exes: list[str], daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    pair = [CLIENTS[key] for key in PAIR]
    exes = pair_exes
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

    barrier = threading.Barrier(len(pair), action=servers_now, timeout=BARRIER_TIMEOUT)

    def meet() -> None:
        barrier.wait()

    scripts = [Script(suffix="up__pid", arguments={}, on_first_result=meet) for _ in pair]
    runs: list[Run] = []

    async def one(client: Client, exe: str, script: Script) -> None:
        runs.append(await run_client(client, exe, daemon, settings, tmp_path, script))

    async with trio.open_nursery() as nursery:
        for client, exe, script in zip(pair, exes, scripts, strict=True):
            nursery.start_soon(one, client, exe, script)

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


# Claude Code defers MCP tools behind ToolSearch when tool search is on (ENABLE_TOOL_SEARCH;
# off by default with a custom ANTHROPIC_BASE_URL) unless a tool carries
# _meta["anthropic/alwaysLoad"], which mcpool sets for `"alwaysLoadTools": true`. Qwen Code
# defers every MCP tool whatever its _meta. Under tool search Claude Code sends its first request
# while MCP servers are still connecting unless told to wait (CLAUDE_WAIT_ENV).
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
        client, exe, daemon, settings, tmp_path, script, extra_env=TOOL_SEARCH_ENV
    )
    MATRIX.setdefault(key, {})[f"deferred_always_load_{always_load}"] = script.deferred

    assert run.returncode == 0, run.explain()
    assert token in run.stdout, run.explain()
    if key == "claude":
        # Loaded up front exactly when mcpool marked the tool alwaysLoad.
        assert script.deferred is not always_load, run.explain()
    else:
        assert script.deferred, run.explain()


def _trust_mcpool_entry(folder: str) -> Callable[[Path], None]:
    def edit(home: Path) -> None:
        path = home / folder / "settings.json"
        settings = json.loads(path.read_text())
        settings["mcpServers"]["mcpool"]["trust"] = True
        path.write_text(json.dumps(settings, indent=2))

    return edit


@pytest.mark.parametrize("key", ["gemini", "qwen"])
async def test_trusted_mcpool_entry_runs_tools_without_yolo(
    key: str, exe: str, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    """gemini-cli and Qwen Code confirm every MCP tool call unless the client's own entry for
    mcpool says `"trust": true`; non-interactive, unconfirmed tools are hidden (gemini-cli) or
    declined (Qwen Code). mcpool's `_meta["mcpool/trust"]` does not count for either."""
    base = CLIENTS[key]

    def without_yolo(*args: Any) -> tuple[list[str], dict[str, str]]:
        argv, env = base.setup(*args)
        return [a for a in argv if a != "--yolo"], env

    client = Client(base.key, base.title, base.peer, base.relists, without_yolo)
    daemon = await daemon_factory()
    token = f"tok-{uuid.uuid4().hex}"
    settings = daemon.settings_file(
        "settings.json", upstream_settings(token, tmp_path / "spawns.log", ["env"])
    )
    script = Script(suffix="up__env", arguments={"name": "MCPOOL_TOKEN"})
    folder = ".gemini" if key == "gemini" else ".qwen"
    run = await run_client(
        client, exe, daemon, settings, tmp_path, script, edit=_trust_mcpool_entry(folder)
    )
    assert run.returncode == 0, run.explain()
    assert token in run.stdout, run.explain()


@pytest.mark.parametrize("slow", [False, True], ids=["fast-upstream", "slow-upstream"])
@pytest.mark.parametrize("key", list(CLIENTS))
async def test_real_client_starts_the_daemon_cold(
    key: str,
    slow: bool,
    exe: str,
    daemon_factory: DaemonFactory,
    tmp_path: Path,
) -> None:
    """No daemon runs: the client's `mcpool attach` starts one (and the upstream), and the
    first tool list the client takes (Codex and Qwen Code take only one) holds the upstream's
    tools, also when the upstream is slow to start (with CLAUDE_WAIT_ENV for Claude Code and
    Codex's `required = true`, which every test here sets up). A server never seen before is
    waited for at most the startup budget (L6: then late servers come by list_changed, which
    Codex and Qwen Code ignore): a user whose first start is slower raises `startupBudget`
    in the user config, as the slow case does; from then on the stored snapshot answers at once."""
    client = CLIENTS[key]
    # Not started: the bridge starts it; the factory's teardown still kills what it left.
    daemon = await daemon_factory(start=False)
    token = f"tok-{uuid.uuid4().hex}"
    delay = {"FAKE_STARTUP_DELAY": COLD_UPSTREAM_DELAY} if slow else {}
    settings = daemon.settings_file(
        "settings.json", upstream_settings(token, tmp_path / "spawns.log", ["env"], **delay)
    )
    script = Script(suffix="up__env", arguments={"name": "MCPOOL_TOKEN"})
    wait = CLAUDE_WAIT_ENV if key == "claude" and slow else None

    def budget(home: Path) -> None:
        # The daemon the bridge starts reads the client user's own mcpool config.
        if slow:
            config = {"daemon": {"startupBudget": COLD_UPSTREAM_DELAY * 4}}
            _write_json(home / ".config" / "mcpool" / "config.json", config)

    run = await run_client(
        client, exe, daemon, settings, tmp_path, script, extra_env=wait, edit=budget
    )
    MATRIX.setdefault(key, {})["slow" if slow else "cold"] = token in run.stdout
    assert run.returncode == 0, run.explain()
    assert script.exposed is not None, run.explain()
    assert token in run.stdout, run.explain()


# 51 characters: `<server>__env` alone fits 64, but not after a client's `mcp__mcpool__` (issue
# 13 saw Claude Code send 77-character names, which the real Anthropic API rejects; gemini-cli
# cut them in the middle, Qwen Code at 63).
LONG_SERVER = "atlassian-confluence-enterprise-workspace-eu-west-1"
NAME_LIMITS = {"claude": 64, "gemini": 63, "qwen": 63, "codex": 64}


@pytest.mark.parametrize("key", list(CLIENTS))
async def test_long_server_names_fit_the_clients_own_limit(
    key: str, exe: str, daemon_factory: DaemonFactory, tmp_path: Path
) -> None:
    client = CLIENTS[key]
    daemon = await daemon_factory()
    token = f"tok-{uuid.uuid4().hex}"
    entry = fake_server(MCPOOL_TOKEN=token)
    settings = daemon.settings_file(
        "settings.json", {LONG_SERVER: {**entry, "includeTools": ["env"]}}
    )
    script = Script(suffix="__env", arguments={"name": "MCPOOL_TOKEN"})
    run = await run_client(client, exe, daemon, settings, tmp_path, script)
    assert run.returncode == 0, run.explain()
    # The name as the model saw it, the client's own prefix included, fits the client's cap
    # (mcpool shortened its part from clientInfo.name), and it still routes to the upstream.
    assert script.exposed is not None, run.explain()
    # Codex offers each server as a Responses namespace: the recorded `namespace/name` is two
    # fields, and the cap is the name's.
    seen = script.exposed.rsplit("/", 1)[-1]
    assert len(seen) <= NAME_LIMITS[key], script.exposed
    assert token in run.stdout, run.explain()
