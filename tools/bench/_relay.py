"""Reference relays for the latency benchmark: the floor any relay process pays on this machine.

    python _relay.py bare|trio SOCKET -- CMD ARGS...

Spawns CMD (the upstream) and serves one client on the Unix socket SOCKET, copying bytes both
ways without parsing them:
- bare: a `selectors` loop with os.read/os.write, the cheapest a Python relay can be;
- trio: trio's wait_readable + os.read/os.write, the same I/O pattern as mcpool's `_fdio`,
  so the difference to `bare` is the event loop's own cost;
- trio-watch: trio, plus a watchfiles `awatch` on an idle folder with the daemon's settings
  (debounce 30 ms, step 5 ms), as the daemon's settings watcher runs: what a watcher thread
  that wakes every step costs the relay (GIL hand-offs).
mcpool's added time minus a reference relay's added time is what mcpool's own processing
(decode, route, rewrite, id mapping, encode) costs.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import sys


def _spawn(argv: list[str]) -> tuple[subprocess.Popen[bytes], int, int]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    return proc, proc.stdout.fileno(), proc.stdin.fileno()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def bare(listener: socket.socket, argv: list[str]) -> None:
    proc, up_r, up_w = _spawn(argv)
    conn, _ = listener.accept()
    c = conn.fileno()
    sel = selectors.DefaultSelector()
    sel.register(c, selectors.EVENT_READ, up_w)
    sel.register(up_r, selectors.EVENT_READ, c)
    while True:
        for key, _ in sel.select():
            data = os.read(key.fd, 1 << 16)
            if not data:
                proc.kill()
                return
            _write_all(key.data, data)


def trio_relay(listener: socket.socket, argv: list[str], watch: str | None = None) -> None:
    import trio

    proc, up_r, up_w = _spawn(argv)
    conn, _ = listener.accept()
    c = conn.fileno()
    for fd in (c, up_r, up_w):
        os.set_blocking(fd, False)

    async def pump(src: int, dst: int) -> None:
        while True:
            await trio.lowlevel.wait_readable(src)
            try:
                data = os.read(src, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                proc.kill()
                raise SystemExit(0)
            _write_all(dst, data)  # small writes on an idle pipe/socket never block here

    async def watcher() -> None:
        import anyio
        from watchfiles import awatch

        assert watch is not None
        async for _ in awatch(watch, debounce=30, step=5, stop_event=anyio.Event()):
            pass

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(pump, c, up_w)
            n.start_soon(pump, up_r, c)
            if watch:
                n.start_soon(watcher)

    with contextlib.suppress(SystemExit):  # the client went away
        trio.run(main)


if __name__ == "__main__":
    mode, path, sep, *cmd = sys.argv[1:]
    assert sep == "--"
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(path)
    lst.listen(1)
    print("ready", flush=True)
    if mode == "bare":
        bare(lst, cmd)
    else:
        # The watched folder: the socket's, which the benchmark removes afterwards.
        trio_relay(lst, cmd, watch=os.path.dirname(path) if mode == "trio-watch" else None)
