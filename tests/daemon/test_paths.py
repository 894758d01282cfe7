from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpool.daemon._paths import (
    config_path,
    daemon_log_path,
    lock_path,
    socket_path,
    state_dir,
)

XDG = ("MCPOOL_SOCKET", "MCPOOL_CONFIG", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in XDG:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_socket_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert socket_path(None) == Path(f"/tmp/mcpool-{os.getuid()}/daemon.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert socket_path(None) == Path("/run/user/7/mcpool/daemon.sock")
    monkeypatch.setenv("MCPOOL_SOCKET", "/srv/m.sock")
    assert socket_path(None) == Path("/srv/m.sock")
    assert socket_path("/cli.sock") == Path("/cli.sock")


def test_config_path_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert config_path(None) == tmp_path / "home/.config/mcpool/config.json"
    monkeypatch.setenv("XDG_CONFIG_HOME", "/xdg/config")
    assert config_path(None) == Path("/xdg/config/mcpool/config.json")
    monkeypatch.setenv("MCPOOL_CONFIG", "/etc/mcpool.json")
    assert config_path(None) == Path("/etc/mcpool.json")
    assert config_path("/cli.json") == Path("/cli.json")


def test_state_dir_and_derived_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert state_dir() == tmp_path / "home/.local/state/mcpool"
    monkeypatch.setenv("XDG_STATE_HOME", "/xdg/state")
    assert state_dir() == Path("/xdg/state/mcpool")
    sock = Path("/run/user/7/mcpool/daemon.sock")
    assert lock_path(sock) == Path("/run/user/7/mcpool/daemon.sock.lock")
    assert daemon_log_path(sock) == Path("/xdg/state/mcpool/daemon.log")


def test_empty_or_relative_xdg_values_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")
    monkeypatch.setenv("MCPOOL_SOCKET", "")
    assert socket_path(None) == Path(f"/tmp/mcpool-{os.getuid()}/daemon.sock")
    assert config_path(None).parts[-3:] == (".config", "mcpool", "config.json")


def test_explicit_relative_paths_are_made_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The daemon runs in "/", so a relative path must mean what it meant where it was typed.
    monkeypatch.chdir(tmp_path)
    assert socket_path("d.sock") == tmp_path / "d.sock"
    monkeypatch.setenv("MCPOOL_CONFIG", "c.json")
    assert config_path(None) == tmp_path / "c.json"
    assert socket_path("~/x.sock") == tmp_path / "home/x.sock"


def test_attach_bridge_imports_stay_light() -> None:
    # The bridge starts for every MCP session: no trio, msgspec, rich, argparse or typing.
    code = (
        "import sys, mcpool.daemon._cli, mcpool.daemon._attach\n"
        "heavy = {'trio', 'msgspec', 'rich', 'argparse', 'anyio', 'typing', 'subprocess'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=10, check=True
    )
    assert out.stdout == "[]\n"
