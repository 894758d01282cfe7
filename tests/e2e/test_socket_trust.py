"""X3, issue 12 item 3: a socket folder, socket file or listener of another user is never used.

Another local user who pre-creates the socket folder (0777, a symlink to their own folder, or a
0700/0755 folder of theirs) and listens on `daemon.sock` there must get nothing from
`mcpool attach` or `daemonctl`: no connection at all when the folder is not ours, and when a
listener of theirs sits in our own folder (moved there by root and given to us), a connection
on which nothing is sent and no fd is passed. The daemon refuses to start in such a folder.
The impostor runs as a second uid made with `useradd`, and records what it receives.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from .harness import daemonctl_argv, fake_server, write_settings
from .test_security import PEER_TIMEOUT, interpreter_for

# useradd/userdel take the passwd lock; another process holding it makes them wait a little.
USERADD_TIMEOUT = 60.0
# A refusing client is one Python start and a few syscalls; a daemon refusing to start imports
# trio first. This only turns a hang (a client that connected and waits) into a failure.
CLIENT_TIMEOUT = 20.0

# Stdlib only, run as the other user: listen on argv[1], print {"ready": true}, then one JSON line
# per connection with the bytes and the number of fds it received, until a connection sends END.
IMPOSTOR = textwrap.dedent(
    """
    import json, os, socket, sys
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sys.argv[1])
    os.chmod(sys.argv[1], 0o777)
    srv.listen(16)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        conn, _ = srv.accept()
        conn.settimeout(10)
        data, fds = b"", 0
        try:
            while data != b"END":
                chunk, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(64))
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds += len(payload) // 4
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        conn.close()
        if data == b"END":
            break
        print(json.dumps({"received": data.decode(errors="replace"), "fds": fds}), flush=True)
    """
)


@dataclass
class OtherUser:
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="module")
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0:
        pytest.skip("a second uid (useradd) and processes running as it need root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")
    name = f"mcpt{os.getpid()}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
        timeout=USERADD_TIMEOUT,
    )
    try:
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=USERADD_TIMEOUT)


@pytest.fixture
def base() -> Iterator[Path]:
    """A short folder under /tmp (socket paths are limited to 107 bytes) the other user may
    traverse, as it may traverse /tmp."""
    path = Path(tempfile.mkdtemp(prefix="mcpt", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def client_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCPOOL_", "XDG_"))}
    env.update(HOME=str(tmp_path / "home"), XDG_STATE_HOME=str(tmp_path / "state"))
    return env


def folder_of(user: OtherUser, path: Path, mode: int) -> Path:
    path.mkdir()
    os.chown(path, user.uid, user.gid)
    path.chmod(mode)
    return path


@asynccontextmanager
async def impostor(user: OtherUser, sock: Path) -> AsyncIterator[list[dict[str, Any]]]:
    """A listener running as `user` on `sock`; the list it yields is filled, when the block
    ends, with one record per connection it accepted."""
    python = await interpreter_for(user.uid)
    records: list[dict[str, Any]] = []
    proc = await trio.lowlevel.open_process(
        [python, "-I", "-c", IMPOSTOR, str(sock)],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        cwd="/",
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    output = bytearray()
    try:
        with trio.fail_after(PEER_TIMEOUT):
            while b"\n" not in output:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the impostor exited before listening"
                output += chunk
        assert json.loads(output.split(b"\n")[0]) == {"ready": True}
        yield records
        # The END connection comes after every client's: once it is seen, all were recorded.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as marker:
            marker.connect(str(sock))
            marker.sendall(b"END")
        with trio.fail_after(PEER_TIMEOUT):
            while chunk := await proc.stdout.receive_some():
                output += chunk
            await proc.wait()
        lines = output.decode().splitlines()[1:]
        records.extend(json.loads(line) for line in lines if line.strip())
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.move_on_after(PEER_TIMEOUT):
                await proc.wait()


async def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(CLIENT_TIMEOUT):
        return await trio.run_process(
            argv, stdin=b"", capture_stdout=True, capture_stderr=True, check=False, env=env
        )


async def attach_and_daemonctl(sock: Path, tmp_path: Path) -> list[str]:
    """Run `mcpool attach` (stdin and stdout pipes: it would hand them over), `daemonctl
    status` and `daemonctl start` on `sock`; each must fail; their stderr."""
    env = client_env(tmp_path)
    settings = write_settings(tmp_path / "settings.json", {"fake": fake_server()})
    attach = [sys.executable, "-m", "mcpool", "attach", "--socket", str(sock)]
    attach += ["--settings", str(settings), "--name", "victim"]
    outputs = []
    for argv in (attach, daemonctl_argv(sock, "status"), daemonctl_argv(sock, "start")):
        done = await run(argv, env)
        assert done.returncode == 1, (argv, done)
        assert done.stdout == b"", done.stdout
        outputs.append(done.stderr.decode())
    return outputs


async def daemon_refuses(sock: Path, tmp_path: Path) -> str:
    argv = [sys.executable, "-m", "mcpool", "daemon", "--socket", str(sock)]
    argv += ["--config", str(tmp_path / "config.json")]
    done = await run(argv, client_env(tmp_path))
    assert done.returncode == 1, done
    return done.stderr.decode()


def assert_names(message: str, path: Path, user: OtherUser, mode: str) -> None:
    assert str(path) in message, message
    assert f"{user.name} (uid {user.uid})" in message, message
    assert f"mode {mode}" in message, message
    assert "--socket or MCPOOL_SOCKET" in message, message  # what to do


async def test_a_world_writable_folder_of_another_user_is_refused(
    other_user: OtherUser, base: Path, tmp_path: Path
) -> None:
    folder = folder_of(other_user, base / "mcpool-0", 0o777)
    sock = folder / "daemon.sock"
    async with impostor(other_user, sock) as records:
        for message in await attach_and_daemonctl(sock, tmp_path):
            assert_names(message, folder, other_user, "0777")
            assert "is owned by" in message
        assert_names(await daemon_refuses(sock, tmp_path), folder, other_user, "0777")
    assert records == []  # never even connected
    assert sorted(os.listdir(folder)) == ["daemon.sock"]  # the daemon made no lock there
    assert folder.stat().st_mode & 0o777 == 0o777  # nor took the folder over


async def test_a_symlink_to_another_users_folder_is_refused(
    other_user: OtherUser, base: Path, tmp_path: Path
) -> None:
    real = folder_of(other_user, base / "theirs", 0o755)
    link = base / "mcpool-0"
    link.symlink_to(real)
    os.lchown(link, other_user.uid, other_user.gid)
    async with impostor(other_user, real / "daemon.sock") as records:
        for message in await attach_and_daemonctl(link / "daemon.sock", tmp_path):
            assert_names(message, link, other_user, "0777")
            assert f"is a symbolic link to {real}" in message
        message = await daemon_refuses(link / "daemon.sock", tmp_path)
        assert_names(message, link, other_user, "0777")
    assert records == []
    assert sorted(os.listdir(real)) == ["daemon.sock"]


@pytest.mark.parametrize("mode", [0o700, 0o755], ids=["0700", "0755"])
async def test_a_private_folder_of_another_user_is_refused_with_a_clear_error(
    other_user: OtherUser, base: Path, tmp_path: Path, mode: int
) -> None:
    # Root could reach into it; before the check, that was a confusing denial of service for a
    # normal user and a connection to the impostor for root.
    folder = folder_of(other_user, base / "mcpool-0", mode)
    sock = folder / "daemon.sock"
    async with impostor(other_user, sock) as records:
        for message in await attach_and_daemonctl(sock, tmp_path):
            assert_names(message, folder, other_user, f"{mode:04o}")
        assert_names(await daemon_refuses(sock, tmp_path), folder, other_user, f"{mode:04o}")
    assert records == []
    assert sorted(os.listdir(folder)) == ["daemon.sock"]


async def test_a_listener_of_another_uid_in_our_own_folder_gets_nothing(
    other_user: OtherUser, base: Path, tmp_path: Path
) -> None:
    ours = base / "ours"
    ours.mkdir(mode=0o700)
    theirs = folder_of(other_user, base / "theirs", 0o755)
    sock = ours / "daemon.sock"
    async with impostor(other_user, theirs / "daemon.sock") as records:
        # Root moves the impostor's socket into our good folder and gives the file to us: the
        # folder and file checks pass, and only SO_PEERCRED tells who listens.
        os.rename(theirs / "daemon.sock", sock)
        os.chown(sock, os.geteuid(), os.getegid())
        for message in await attach_and_daemonctl(sock, tmp_path):
            assert f"the process listening on {sock}" in message, message
            assert f"runs as {other_user.name} (uid {other_user.uid})" in message, message
        # Marker connection of impostor() goes to the socket's new place.
        os.rename(sock, theirs / "daemon.sock")
    # Each client connected, then hung up without a byte or an fd.
    assert records == [{"received": "", "fds": 0}] * 3
