"""L5: the shutdown bound includes entries still starting (issue 15, point 6).

An upstream that is spawned but has not finished its handshake has no `entry.upstream` yet;
`Pool.kill_all` used to skip it, so `shutdownTimeout` 1 s gave an exit after about 4 s (the
starting connection's own close ran stdin grace, SIGTERM grace and SIGKILL after the bound).
"""

from __future__ import annotations

import signal

import trio

from e2e.harness import DaemonFactory, fake_server, write_settings
from e2e.support import alive, process, wait_until

WAIT = 20.0  # a cold daemon, an attach and a spawn on a loaded machine
SHUTDOWN_TIMEOUT = 1.0
# What the bound may be exceeded by: SIGKILL and reaping, interpreter exit; well short of the
# ~3 s the starting entry's own L4 close added before.
EXIT_SLACK = 2.0


async def test_shutdown_bound_includes_an_upstream_still_starting_that_ignores_sigterm(
    daemon_factory: DaemonFactory,
) -> None:
    d = await daemon_factory(daemon={"shutdownTimeout": SHUTDOWN_TIMEOUT})
    spawn_log = d.root / "spawns.log"
    env: dict[str, str | int | float] = {
        "FAKE_STARTUP_DELAY": 120,  # never answers initialize within the test
        "FAKE_IGNORE_STDIN_EOF": 1,
        "FAKE_SPAWN_LOG": str(spawn_log),
        "FAKE_IGNORE_SIGTERM": 1,
    }
    starting = {**fake_server(**env), "timeout": 300_000}
    settings = write_settings(d.root / "s.json", {"starting": starting})
    async with d.raw() as client:
        reply = await client.request(
            "mcpool/attach", {"sources": [str(settings)], "cwd": str(d.root), "name": "t"}
        )
        assert "result" in reply
        with trio.fail_after(WAIT):
            await wait_until(lambda: spawn_log.exists() and spawn_log.read_text().strip() != "")
        upstream = process(int(spawn_log.read_text().split()[0]))
        servers = await d.ctl("servers")
        assert servers[0]["pid"] is None  # still starting: no connection is up yet
        assert d.process is not None
        d.process.send_signal(signal.SIGTERM)
        with trio.fail_after(SHUTDOWN_TIMEOUT + EXIT_SLACK):
            code = await d.process.wait()
    assert code == 0
    assert not alive(upstream), d.output()
