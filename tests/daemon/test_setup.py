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
