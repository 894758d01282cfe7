"""X1: the socket lives in a 0700 directory and is 0600, and even when those permissions are
loosened the daemon refuses a peer whose uid differs from its own (SO_PEERCRED)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
import trio

from .harness import DaemonFactory, fake_server
from .support import STEP_TIMEOUT, raw_attach, raw_call, raw_text

ATTACH_FAILED = -31005
NOBODY = 65534
# A child interpreter start plus one connect and one read.
PEER_TIMEOUT = 15.0

# Stdlib only, run as another user: connect, send an attach, print every line the daemon sends
# back until it closes the connection, and how the connection ended, as JSON on stdout.
OTHER_UID_CLIENT = textwrap.dedent(
    """
    import json, socket, sys
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(sys.argv[1])
    attach = {"jsonrpc": "2.0", "id": 1, "method": "mcpool/attach",
              "params": {"sources": [], "cwd": None, "name": "intruder", "clientPid": None}}
    try:
        sock.sendall(json.dumps(attach).encode() + b"\\n")
    except OSError:
        pass  # the daemon may already have closed its end
    data, ending = b"", "eof"
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        ending = type(exc).__name__
    lines = [json.loads(line) for line in data.splitlines() if line.strip()]
    print(json.dumps({"received": lines, "ending": ending}))
    """
)


def python_candidates() -> list[str]:
    found = [os.path.realpath(sys.executable), shutil.which("python3"), "/usr/bin/python3"]
    return [candidate for candidate in found if candidate]


async def interpreter_for(uid: int) -> str:
    """A Python the other user can execute (a venv under /root is not traversable by nobody)."""
    for candidate in python_candidates():
        try:
            with trio.fail_after(PEER_TIMEOUT):
                probe = await trio.run_process(
                    [candidate, "-I", "-c", "pass"],
                    user=uid,
                    cwd="/",
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    check=False,
                )
        except OSError:  # exec refused: the other user cannot reach this interpreter
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip(f"no Python interpreter is executable by uid {uid}")


@pytest.mark.skipif(os.geteuid() != 0, reason="a setuid child needs root")
async def test_a_connection_from_another_uid_is_refused(daemon_factory: DaemonFactory) -> None:
    daemon = await daemon_factory()
    settings = daemon.settings_file("settings.json", {"fake": fake_server()})
    sock_dir = daemon.sock.parent
    assert stat.S_IMODE(sock_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(daemon.sock.stat().st_mode) == 0o600
    # Let the kernel through, so the daemon's own peer check is what refuses the other user.
    sock_dir.chmod(0o777)
    daemon.sock.chmod(0o777)

    python = await interpreter_for(NOBODY)
    with trio.fail_after(PEER_TIMEOUT):
        done = await trio.run_process(
            [python, "-I", "-c", OTHER_UID_CLIENT, str(daemon.sock)],
            user=NOBODY,
            cwd="/",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    outcome = json.loads(done.stdout)
    received = outcome["received"]
    assert outcome["ending"] == "eof", outcome
    assert len(received) == 1, received
    (refusal,) = received
    assert refusal["error"]["code"] == ATTACH_FAILED, refusal
    assert str(NOBODY) in json.dumps(refusal["error"].get("data")), refusal
    assert "result" not in refusal

    # Nothing was attached for the intruder, and our own uid is still served (once the folder
    # is private again: our own clients refuse a folder others can write to).
    sock_dir.chmod(0o700)
    assert await daemon.ctl("sessions") == []
    async with daemon.raw() as client:
        await raw_attach(client, [str(settings)], "owner")
        with trio.fail_after(STEP_TIMEOUT):
            assert raw_text(await raw_call(client, "fake__echo", {"text": "mine"})) == "mine"
