"""Issue 28 item 2: an entry that cannot work for a reason a retry cannot fix is `failed` with
that reason, not retried. Real processes: the daemon, a session, commands that cannot run."""

from __future__ import annotations

import trio

from e2e.harness import DaemonFactory, fake_server
from e2e.support import servers_of, tool_names

# With a 0.1 s first backoff, a retried entry would have tried about ten times in this.
WATCH = 1.5


async def test_a_command_that_is_not_there_fails_once_with_its_reason(
    daemon_factory: DaemonFactory,
) -> None:
    daemon = await daemon_factory(daemon={"backoffInitial": 0.1, "backoffMax": 0.2})
    not_a_program = daemon.root / "plain.txt"
    not_a_program.write_text("hello")
    settings = daemon.settings_file(
        "s.json",
        {
            "gone": {"command": "/nonexistent/mcp-server"},
            "text": {"command": str(not_a_program)},  # there, but not executable
            "ok": fake_server(),
        },
    )
    async with daemon.attach([settings], "one") as one:
        assert "ok__echo" in await tool_names(one)
        await trio.sleep(WATCH)
        servers = {s["name"]: s for s in await servers_of(daemon)}
        for name in ("gone", "text"):
            assert servers[name]["state"] == "failed", servers[name]
            assert "could not be started" in str(servers[name]["last_error"]), servers[name]
        assert servers["ok"]["state"] == "active"
    log = daemon.log_path.read_text()
    assert log.count("server 'gone' failed to start") == 1, log
    assert log.count("server 'text' failed to start") == 1, log
