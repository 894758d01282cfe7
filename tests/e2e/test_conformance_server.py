"""Issues 15, 18 and 29: the conformance suite's server scenarios (0.2.0-alpha, pinned in .peers)
pass through mcpool wherever they pass directly, at 2025-06-18, 2025-11-25 and 2026-07-28.

tools/conformance.sh runs them against our reference server (tools/conformance_server.py)
directly and through `mcpool daemon --http` with that server behind it as a stdio and as an HTTP
upstream, and at the handshake revisions as two suites at once on one pooled stdio upstream. It
exits 1 on a check that passes directly but not through mcpool (and is not in its KNOWN list),
or on an error a daemon logged. Real processes: node and the suite, the server, three daemons;
127.0.0.1 only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import trio

pytestmark = [pytest.mark.peers, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# One revision: a server and two daemons started, then three suite runs of ~5 s each.
CONFORMANCE_TIMEOUT = 180.0
# What the reference server passes directly at least (all of a revision's checks but the tasks
# extension's, which it does not implement): a direct baseline that proves little fails here.
DIRECT_AT_LEAST = {"2025-06-18": 56, "2025-11-25": 73, "2026-07-28": 148}


@pytest.mark.parametrize("revision", sorted(DIRECT_AT_LEAST))
async def test_conformance_parity(tmp_path: Path, revision: str) -> None:
    if not (REPO / ".peers" / "env.sh").exists():
        pytest.skip("the pinned peers (.peers, tools/peers.sh) are not installed")
    with trio.fail_after(CONFORMANCE_TIMEOUT):
        done = await trio.run_process(
            ["bash", str(REPO / "tools" / "conformance.sh"), revision],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "| scenario | check | direct | via stdio upstream | via HTTP upstream |" in out
    assert "| tools-call-simple-text | tools-call-simple-text | pass | pass | pass |" in out
    counts = {
        name: (int(passed), int(total))
        for name, passed, total in re.findall(rf"{revision} ([\w-]+): (\d+)/(\d+) checks pass", out)
    }
    assert counts["direct"][0] >= DIRECT_AT_LEAST[revision], counts
    # The same scenarios ran through mcpool: each reported as many checks as the direct run.
    assert counts["stdio"][1] == counts["http"][1] == counts["direct"][1], counts
    if revision != "2026-07-28":
        # Two suites at once on one pooled stdio upstream that asks its clients things: each
        # gives the single run's result (issue 29 item 3; a regression fails the script too).
        assert counts["twice-a"] == counts["twice-b"] == counts["direct"], counts
