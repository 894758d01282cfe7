"""`mcpool attach` starts the daemon when none answers; racing attaches start exactly one."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import trio

from e2e.harness import fake_server, kill_leftovers, write_settings

WAIT = 20.0
INIT = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
)


def daemons_on(sock: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "daemon" in cmd and str(sock) in cmd:
            found.append(proc)
    return found


async def test_racing_attaches_start_one_daemon_and_all_sessions_work(tmp_path: Path):
    sock_dir = Path(tempfile.mkdtemp(prefix="mcp"))
    sock = sock_dir / "daemon.sock"
    settings = write_settings(tmp_path / "s.json", {"fake": fake_server()})
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MCPOOL_")},
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    argv = [sys.executable, "-m", "mcpool", "attach", "--socket", str(sock),
            "--settings", str(settings)]  # fmt: skip
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        for _ in range(4)
    ]
    try:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(INIT)
            p.stdin.flush()

        def read_answer(p: subprocess.Popen[bytes]) -> bytes:
            assert p.stdout is not None
            return p.stdout.readline()

        with trio.fail_after(WAIT):
            answers = [await trio.to_thread.run_sync(read_answer, p) for p in procs]
        assert all(b'"protocolVersion"' in a for a in answers), answers
        # Losers of the start race exit on their own once they see the lock is taken.
        with trio.fail_after(WAIT):
            while len(daemons_on(sock)) > 1:
                await trio.sleep(0.05)
        assert len(daemons_on(sock)) == 1
        # What the started daemon writes may quote settings: its stderr and log are 0600.
        for name in ("daemon.stderr", "daemon.log"):
            path = tmp_path / "state" / "mcpool" / name
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        # The daemon goes away: every bridge exits non-zero with one line on stderr.
        daemon = daemons_on(sock)[0]
        daemon.send_signal(signal.SIGTERM)
        with trio.fail_after(WAIT):
            codes = [await trio.to_thread.run_sync(p.wait) for p in procs]
        assert all(code != 0 for code in codes), codes
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        kill_leftovers([d.pid for d in daemons_on(sock)], [str(sock_dir), str(tmp_path)])
