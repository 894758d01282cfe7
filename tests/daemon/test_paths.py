from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpool.daemon._paths import (
    RUN_USER_BASE_ENV,
    UnsafeSocketPath,
    check_socket_dir,
    check_socket_path,
    client_socket_path,
    config_path,
    daemon_log_path,
    default_socket_path,
    lock_path,
    prepare_socket_dir,
    socket_path,
    state_dir,
)

XDG = ("MCPOOL_SOCKET", "MCPOOL_CONFIG", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in XDG:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # No /run/user/<uid> unless a test makes one: the machine's own must not decide the result.
    monkeypatch.setenv(RUN_USER_BASE_ENV, str(tmp_path / "no-run-user"))


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


def private_folder(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(parents=True)
    path.chmod(mode)
    return path


def test_run_user_is_found_without_xdg_runtime_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Codex and the SDK's default environment drop XDG_RUNTIME_DIR: the bridge still finds the
    # daemon in the login manager's runtime folder when that folder is ours.
    base = tmp_path / "run-user"
    monkeypatch.setenv(RUN_USER_BASE_ENV, str(base))
    tmp_default = Path(f"/tmp/mcpool-{os.geteuid()}/daemon.sock")
    assert socket_path(None) == tmp_default  # no such folder
    runtime = private_folder(base / str(os.geteuid()))
    assert socket_path(None) == runtime / "mcpool" / "daemon.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert socket_path(None) == runtime / "mcpool" / "daemon.sock"  # the same daemon either way
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    runtime.chmod(0o755)  # not private: not a runtime folder to trust
    assert socket_path(None) == tmp_default
    runtime.chmod(0o700)
    runtime.rename(base / "real")
    (base / str(os.geteuid())).symlink_to(base / "real")
    assert socket_path(None) == tmp_default
    assert default_socket_path(str(base)) == tmp_default


def test_the_path_a_client_launched_bridge_finds_ignores_dropped_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MCPOOL_SOCKET", "/srv/m.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert client_socket_path() == Path(f"/tmp/mcpool-{os.geteuid()}/daemon.sock")
    config = tmp_path / "home" / ".config" / "mcpool" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"daemon": {"socket": "/srv/configured.sock"}}')
    assert client_socket_path() == Path("/srv/configured.sock")


def test_a_private_folder_of_ours_is_trusted(tmp_path: Path) -> None:
    assert check_socket_dir(tmp_path / "missing") is False
    assert check_socket_dir(private_folder(tmp_path / "ok")) is True
    check_socket_path(tmp_path / "ok" / "daemon.sock")  # no socket yet: the daemon makes one


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o777, 0o701])
def test_a_folder_others_can_reach_is_refused_with_its_path_owner_and_mode(
    tmp_path: Path, mode: int
) -> None:
    folder = private_folder(tmp_path / "open", mode)
    with pytest.raises(UnsafeSocketPath) as raised:
        check_socket_dir(folder)
    message = str(raised.value)
    assert str(folder) in message
    assert f"{mode:04o}" in message
    assert f"uid {os.geteuid()}" in message
    assert f"chmod 700 {folder}" in message


def test_a_symlink_or_a_file_is_never_a_socket_folder(tmp_path: Path) -> None:
    target = private_folder(tmp_path / "target")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafeSocketPath, match="is a symbolic link") as raised:
        check_socket_path(link / "daemon.sock")
    assert str(link) in str(raised.value)
    assert str(target) in str(raised.value)
    # The daemon neither creates nor follows it.
    with pytest.raises(UnsafeSocketPath, match="is a symbolic link"):
        prepare_socket_dir(link / "daemon.sock")
    assert list(target.iterdir()) == []
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(UnsafeSocketPath, match="is not a folder"):
        prepare_socket_dir(plain / "daemon.sock")


def test_the_daemon_creates_only_the_last_component_0700(tmp_path: Path) -> None:
    old = os.umask(0o277)  # a umask that would leave the owner without write access
    try:
        prepare_socket_dir(tmp_path / "new" / "daemon.sock")
    finally:
        os.umask(old)
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    with pytest.raises(UnsafeSocketPath, match="does not exist") as raised:
        prepare_socket_dir(tmp_path / "a" / "b" / "daemon.sock")
    assert str(tmp_path / "a") in str(raised.value)
    assert not (tmp_path / "a").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_socket_file_of_another_uid_is_refused(tmp_path: Path) -> None:
    folder = private_folder(tmp_path / "ok")
    sock = folder / "daemon.sock"
    sock.write_text("")
    os.chown(sock, 65534, 65534)
    with pytest.raises(UnsafeSocketPath, match="is owned by") as raised:
        check_socket_path(sock)
    assert "uid 65534" in str(raised.value)
