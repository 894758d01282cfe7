"""`mcpool setup-client`, `mcpool systemd-unit`, and the console script's lazy dispatch."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from commands import mcpool

WAIT = 30.0


@pytest.mark.parametrize(
    ("client", "key", "extra"),
    [
        ("claude-code", "mcpServers", {}),
        ("cursor", "mcpServers", {}),
        ("claude-desktop", "mcpServers", {}),
        ("vscode", "servers", {"type": "stdio"}),
    ],
)
def test_snippet_points_at_mcpool_attach(
    tmp_path: Path, client: str, key: str, extra: dict[str, str]
) -> None:
    done = mcpool("setup-client", client, home=tmp_path)
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)[key]["mcpool"]
    assert entry == {**extra, "command": entry["command"], "args": entry["args"]}
    assert os.path.isabs(entry["command"])
    assert [*entry["args"]][-1] == "attach"
    assert "--write` adds it to" in done.stderr
    assert not list(tmp_path.iterdir())  # printing writes nothing


def attach_args_written(home: Path, env: dict[str, str], *args: str) -> list[str]:
    done = mcpool("setup-client", "cursor", *args, home=home, env=env)
    assert done.returncode == 0, done.stderr
    args_ = json.loads(done.stdout)["mcpServers"]["mcpool"]["args"]
    return list(args_[args_.index("attach") :])


def test_socket_is_named_only_when_a_client_launched_bridge_would_miss_it(tmp_path: Path) -> None:
    # Clients drop MCPOOL_SOCKET and XDG_RUNTIME_DIR from a server's environment (Codex, the
    # SDK's default): the entry names the socket exactly when the bridge would not find it.
    runtime_base = tmp_path / "run-user"
    runtime = runtime_base / str(os.geteuid())
    runtime.mkdir(parents=True, mode=0o700)
    found_anyway = {"MCPOOL_TEST_RUN_USER_BASE": str(runtime_base)}
    assert attach_args_written(tmp_path, found_anyway) == ["attach"]
    # XDG_RUNTIME_DIR is the runtime folder the bridge finds by itself: nothing to name.
    same = {**found_anyway, "XDG_RUNTIME_DIR": str(runtime)}
    assert attach_args_written(tmp_path, same) == ["attach"]
    elsewhere = {**found_anyway, "XDG_RUNTIME_DIR": str(tmp_path / "elsewhere")}
    sock = str(tmp_path / "elsewhere" / "mcpool" / "daemon.sock")
    assert attach_args_written(tmp_path, elsewhere) == ["attach", "--socket", sock]
    assert attach_args_written(tmp_path, {"MCPOOL_SOCKET": "/srv/m.sock"}) == [
        "attach",
        "--socket",
        "/srv/m.sock",
    ]
    explicit = attach_args_written(tmp_path, found_anyway, "--socket", "/srv/x.sock")
    assert explicit == ["attach", "--socket", "/srv/x.sock"]


def test_write_merges_into_the_clients_file_with_a_backup(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / ".vscode").mkdir(parents=True)
    target = project / ".vscode" / "mcp.json"
    before = {"servers": {"fetch": {"type": "stdio", "command": "uvx"}}, "inputs": []}
    target.write_text(json.dumps(before))
    done = mcpool("setup-client", "vscode", "--write", home=tmp_path, cwd=project)
    assert done.returncode == 0, done.stderr
    assert f"wrote {target}" in done.stdout
    assert "still starts its own servers (fetch)" in done.stdout
    after = json.loads(target.read_text())
    assert after["servers"]["fetch"] == before["servers"]["fetch"]
    assert after["servers"]["mcpool"]["args"][-1] == "attach"
    assert after["inputs"] == []
    (backup,) = (project / ".vscode").glob("mcp.json.bak-*")
    assert json.loads(backup.read_text()) == before


def test_write_creates_a_missing_file(tmp_path: Path) -> None:
    done = mcpool("setup-client", "cursor", "--write", home=tmp_path)
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / ".cursor" / "mcp.json").read_text())
    assert list(written["mcpServers"]) == ["mcpool"]
    assert "previous version" not in done.stdout


def test_write_refuses_a_file_with_comments(tmp_path: Path) -> None:
    target = tmp_path / "mcp.json"
    text = '{\n  // mine\n  "mcpServers": {}\n}\n'
    target.write_text(text)
    done = mcpool("setup-client", "cursor", "--write", "--file", str(target), home=tmp_path)
    assert done.returncode == 1
    assert "add the snippet by hand" in done.stderr
    assert target.read_text() == text


def test_systemd_unit(tmp_path: Path) -> None:
    done = mcpool("systemd-unit", home=tmp_path)
    assert done.returncode == 0, done.stderr
    unit = done.stdout
    exec_start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    assert exec_start.endswith(" daemon")
    assert "[Install]\nWantedBy=default.target" in unit
    assert "KillMode=mixed" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    # The daemon exits non-zero only when it failed (a requested stop is 0): restart on that.
    assert "\nRestart=on-failure\n" in unit
    assert "\nRestartSec=2\n" in unit


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert mcpool("setup-client", "emacs", home=tmp_path).returncode == 2
    assert mcpool("demo", "--bogus", home=tmp_path).returncode == 2
    assert mcpool("nonsense", home=tmp_path).returncode == 2
    help_text = mcpool("--help", home=tmp_path).stdout
    for command in ("demo", "import --from", "setup-client", "systemd-unit"):
        assert command in help_text


def test_attach_imports_none_of_the_other_subcommands() -> None:
    # The bridge's start-up is every client's latency: dispatch must stay lazy.
    code = (
        "import sys\n"
        "from mcpool.daemon import _cli\n"
        "_cli.main(['attach', '--help'])\n"
        "heavy = {'argparse', 'rich', 'trio', 'msgspec', 'mcpool.daemon._demo',\n"
        "         'mcpool.daemon._import', 'mcpool.daemon._setup', 'mcpool.daemon._ctl'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_codex_write_keeps_comments_and_other_servers_with_a_0600_backup(tmp_path: Path) -> None:
    codex = tmp_path / ".codex"
    codex.mkdir()
    before = '# mine\nmodel = "o3"  # keep\n\n[mcp_servers.fetch]\ncommand = "uvx"\n'
    (codex / "config.toml").write_text(before)
    done = mcpool("setup-client", "codex", "--write", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "still starts its own servers (fetch)" in done.stdout
    text = (codex / "config.toml").read_text()
    assert text.startswith(before)  # comments, layout and the other entry untouched
    import tomllib

    entry = tomllib.loads(text)["mcp_servers"]["mcpool"]
    assert os.path.isabs(entry["command"])
    assert entry["args"][-1] == "attach"
    (backup,) = codex.glob("config.toml.bak-*")
    assert backup.read_text() == before
    assert backup.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("client", ["gemini", "qwen"])
def test_gemini_and_qwen_user_and_project_scope(tmp_path: Path, client: str) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    done = mcpool("setup-client", client, "--write", home=tmp_path, cwd=project)
    assert done.returncode == 0, done.stderr
    user_file = tmp_path / f".{client}" / "settings.json"
    assert json.loads(user_file.read_text())["mcpServers"]["mcpool"]["args"][-1] == "attach"
    done = mcpool(
        "setup-client", client, "--write", "--scope", "project", home=tmp_path, cwd=project
    )
    assert done.returncode == 0, done.stderr
    project_file = project / f".{client}" / "settings.json"
    assert "mcpool" in json.loads(project_file.read_text())["mcpServers"]


def test_json_backup_is_0600(tmp_path: Path) -> None:
    target = tmp_path / ".cursor" / "mcp.json"
    target.parent.mkdir()
    target.write_text('{"mcpServers": {}}')
    target.chmod(0o644)
    assert mcpool("setup-client", "cursor", "--write", home=tmp_path).returncode == 0
    (backup,) = target.parent.glob("mcp.json.bak-*")
    assert backup.stat().st_mode & 0o777 == 0o600


def test_claude_code_project_write_explains_approval_and_the_loop_guard(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    done = mcpool("setup-client", "claude-code", "--write", home=tmp_path, cwd=project)
    assert done.returncode == 0, done.stderr
    assert "approve 'mcpool'" in done.stdout
    assert "never becomes its own upstream" in done.stdout


def test_write_backup_and_file_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / ".vscode").mkdir(parents=True)
    target = project / ".vscode" / "mcp.json"
    target.write_text(json.dumps({"servers": {"gh": {"command": "x", "env": {"TOKEN": "s"}}}}))
    target.chmod(0o644)  # a client file left readable: the copy holding its token must not be
    old = os.umask(0)
    try:
        done = mcpool("setup-client", "vscode", "--write", home=tmp_path, cwd=project)
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    (backup,) = (project / ".vscode").glob("mcp.json.bak-*")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in (project / ".vscode").iterdir()) == ["mcp.json", backup.name]


def test_write_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "cursor-mcp.json"
    real.parent.mkdir()
    real.write_text(json.dumps({"mcpServers": {}}))
    link = tmp_path / ".cursor" / "mcp.json"
    link.parent.mkdir()
    link.symlink_to(real)
    done = mcpool("setup-client", "cursor", "--write", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink()
    assert "mcpool" in json.loads(real.read_text())["mcpServers"]


# --- Copilot CLI, opencode, Cline, and Claude Code's user scope (issue 28) ---------------------

# client -> (its file under HOME, the key of its servers, what the mcpool entry must hold)
NEW_CLIENTS = {
    "copilot": (".copilot/mcp-config.json", "mcpServers", {"type": "local", "tools": ["*"]}),
    "opencode": (".config/opencode/opencode.json", "mcp", {"type": "local", "enabled": True}),
    "cline": (".cline/data/settings/cline_mcp_settings.json", "mcpServers", {}),
    "claude-code": (".claude.json", "mcpServers", {}),
}


def _launch(client: str, entry: dict[str, object]) -> list[str]:
    """The command line an entry runs, whatever the client's shape."""
    if client == "opencode":
        command = entry["command"]
        assert isinstance(command, list)
        return [str(c) for c in command]
    if client == "cline":
        transport = entry["transport"]
        assert isinstance(transport, dict)
        assert transport["type"] == "stdio"
        entry = transport
    args = entry["args"]
    assert isinstance(args, list)
    return [str(entry["command"]), *map(str, args)]


def _scope(client: str) -> tuple[str, ...]:
    return ("--scope", "user") if client == "claude-code" else ()


@pytest.mark.parametrize("client", list(NEW_CLIENTS))
def test_new_clients_write_rewrite_keep_others_and_import_back(tmp_path: Path, client: str) -> None:
    relative, key, shape = NEW_CLIENTS[client]
    target = tmp_path / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    other = {"command": "uvx", "args": ["mcp-server-time"]}
    if client == "opencode":
        other = {"type": "local", "command": ["uvx", "mcp-server-time"]}
    before = {"someSetting": {"kept": True}, key: {"time": other}}
    target.write_text(json.dumps(before))
    target.chmod(0o644)
    done = mcpool("setup-client", client, "--write", *_scope(client), home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"wrote {target}" in done.stdout
    assert "still starts its own servers (time)" in done.stdout
    after = json.loads(target.read_text())
    assert after["someSetting"] == {"kept": True}
    assert after[key]["time"] == other
    entry = after[key]["mcpool"]
    assert entry.items() >= shape.items(), entry
    launch = _launch(client, entry)
    assert os.path.isabs(launch[0])
    assert launch[-1] == "attach"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    (backup,) = target.parent.glob(f"{target.name}.bak-*")
    assert json.loads(backup.read_text()) == before
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    # Again: the same one entry, the others still there.
    again = mcpool("setup-client", client, "--write", *_scope(client), home=tmp_path)
    assert again.returncode == 0, again.stderr
    rewritten = json.loads(target.read_text())
    assert rewritten == after
    # Imported back, mcpool is skipped and the client's own server comes over.
    imported = mcpool("import", "--from", client, str(target), "--dry-run", home=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert sorted(json.loads(imported.stdout)["mcpServers"]) == ["time"]
    assert "mcpool: skipped, it is mcpool itself" in imported.stderr


@pytest.mark.parametrize("client", list(NEW_CLIENTS))
def test_new_clients_refuse_a_commented_file(tmp_path: Path, client: str) -> None:
    relative, key, _ = NEW_CLIENTS[client]
    target = tmp_path / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    text = f'{{\n  // mine\n  "{key}": {{}}\n}}\n'
    target.write_text(text)
    done = mcpool("setup-client", client, "--write", *_scope(client), home=tmp_path)
    assert done.returncode == 1
    assert "comments or trailing commas would be lost" in done.stderr
    assert target.read_text() == text
    assert list(target.parent.iterdir()) == [target]


def test_new_clients_files_are_created_where_each_reads_them(tmp_path: Path) -> None:
    for client, (relative, key, _) in NEW_CLIENTS.items():
        done = mcpool("setup-client", client, "--write", *_scope(client), home=tmp_path)
        assert done.returncode == 0, done.stderr
        written = json.loads((tmp_path / relative).read_text())
        assert list(written[key]) == ["mcpool"], client


def test_the_new_clients_own_locations_follow_their_variables(tmp_path: Path) -> None:
    cases = {
        "copilot": ({"COPILOT_HOME": str(tmp_path / "cop")}, tmp_path / "cop" / "mcp-config.json"),
        "cline": ({"CLINE_DIR": str(tmp_path / "cl")}, tmp_path / "cl/data/settings"),
        "opencode": ({"OPENCODE_CONFIG": str(tmp_path / "oc.json")}, tmp_path / "oc.json"),
        "claude-code": ({"CLAUDE_CONFIG_DIR": str(tmp_path / "cc")}, tmp_path / "cc"),
    }
    for client, (env, where) in cases.items():
        done = mcpool("setup-client", client, *_scope(client), home=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert f"`--write` adds it to {where}" in done.stderr, (client, done.stderr)


def test_opencode_project_scope_and_an_existing_jsonc(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    done = mcpool(
        "setup-client", "opencode", "--write", "--scope", "project", home=tmp_path, cwd=project
    )
    assert done.returncode == 0, done.stderr
    assert "mcpool" in json.loads((project / "opencode.json").read_text())["mcp"]
    # A user whose config is opencode.jsonc gets that file edited (when it holds no comments),
    # not a second opencode.json beside it.
    folder = tmp_path / ".config" / "opencode"
    folder.mkdir(parents=True)
    (folder / "opencode.jsonc").write_text('{"model": "x/y"}')
    done = mcpool("setup-client", "opencode", "--write", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((folder / "opencode.jsonc").read_text())["model"] == "x/y"
    assert not (folder / "opencode.json").exists()


def test_claude_code_user_scope_writes_claude_json_not_the_project(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    state = {"numStartups": 3, "projects": {str(project): {"mcpServers": {}}}}
    (tmp_path / ".claude.json").write_text(json.dumps(state))
    done = mcpool(
        "setup-client", "claude-code", "--write", "--scope", "user", home=tmp_path, cwd=project
    )
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / ".claude.json").read_text())
    assert written["numStartups"] == 3
    assert written["projects"] == state["projects"]
    assert written["mcpServers"]["mcpool"]["args"][-1] == "attach"
    assert not (project / ".mcp.json").exists()
    assert "user scope" in done.stdout
    # Without --scope it is still the project's .mcp.json, as before.
    done = mcpool("setup-client", "claude-code", "--write", home=tmp_path, cwd=project)
    assert done.returncode == 0, done.stderr
    assert "mcpool" in json.loads((project / ".mcp.json").read_text())["mcpServers"]


def test_claude_code_user_scope_refuses_a_claude_json_it_cannot_edit(tmp_path: Path) -> None:
    target = tmp_path / ".claude.json"
    for text, reason in (
        ("{not json", "is not plain JSON"),
        ("[1, 2]", "does not hold a JSON object"),
        ('{"mcpServers": [1]}', "'mcpServers' is not an object"),
    ):
        target.write_text(text)
        done = mcpool("setup-client", "claude-code", "--write", "--scope", "user", home=tmp_path)
        assert done.returncode == 1, done.stdout
        assert reason in done.stderr
        assert str(target) in done.stderr
        assert target.read_text() == text


@pytest.mark.parametrize("client", ["copilot", "cline", "codex"])
def test_a_project_scope_the_client_does_not_have_is_refused(tmp_path: Path, client: str) -> None:
    done = mcpool("setup-client", client, "--write", "--scope", "project", home=tmp_path)
    assert done.returncode == 1
    assert "--scope project:" in done.stderr
    assert not list(tmp_path.iterdir())


def test_a_file_the_client_saved_meanwhile_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code rewrites ~/.claude.json as it runs: a save between our read and our write
    keeps the client's version and refuses ours, rather than losing either."""
    from mcpool.daemon import _setup

    target = tmp_path / ".claude.json"
    target.write_text('{"numStartups": 1}')
    real_backup = _setup.keep_backup

    def client_saves_meanwhile(path: Path) -> Path:
        backup = real_backup(path)
        path.write_text('{"numStartups": 2}')  # the client's own save, after our read
        return backup

    monkeypatch.setattr(_setup, "keep_backup", client_saves_meanwhile)
    with pytest.raises(_setup.SetupError, match="changed while mcpool was editing it"):
        _setup.write_client_file(target, "claude-code", ["/usr/bin/mcpool"])
    assert json.loads(target.read_text()) == {"numStartups": 2}
