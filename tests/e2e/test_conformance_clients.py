"""Issue 18 acceptance: the 0.2.0-alpha conformance suite's client scenarios, with mcpool as the
client, each compared with the same scenario run by the SDK's own client directly.

`tools/conformance_clients.sh REVISION` runs every client scenario the suite has for that
revision (2025-06-18 by its tags; 2025-11-25 and 2026-07-28 by the suite's frozen requirement
sets) twice: `tools/conformance_client.py --direct` (the `mcp` SDK's client against the suite's
server) and `tools/conformance_client.py` (a private daemon whose only upstream is that server,
one session through `mcpool attach` making the same requests). It exits 1 when a check of a
scored scenario passes directly and not through mcpool. The suite's servers listen on every
interface, so the runner runs in a loopback-only network namespace (`unshare -n`, root).

The auth/* scenarios (the broker logs in through `daemonctl login`, 30 s and more each) are left
to a run of the script by hand (README, Conformance: client scenarios) and to
tests/e2e/test_oauth_conformance.py; here: the wire scenarios (initialize, tools_call,
sse-retry, elicitation defaults, request-metadata, sep-2322 request state, the SEP-2243
standard, custom and invalid-tool headers, JSON Schema ones).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from .harness import REPO

pytestmark = [pytest.mark.peers, pytest.mark.slow]

RUNNER = REPO / "tools" / "conformance_clients.sh"
# Every scenario of a revision twice, three suite runs at once (each one node, a daemon and an
# SDK client); about 20 to 40 s here, more on a busy box. A hang is a failure.
RUN_TIMEOUT = 300.0


@pytest.mark.skipif(os.geteuid() != 0, reason="a loopback-only network namespace needs root")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.parametrize("revision", ["2025-06-18", "2025-11-25", "2026-07-28"])
def test_no_client_check_that_passes_directly_fails_through_mcpool(
    peers: dict[str, str], revision: str
) -> None:
    assert peers["PEER_CONFORMANCE_ALPHA_JS"]
    done = subprocess.run(
        [
            "unshare",
            "-n",
            "sh",
            "-c",
            'ip link set lo up && exec "$@"',
            "sh",
            str(RUNNER),
            revision,
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={**os.environ, "SCENARIOS": "!auth/*", "NO_COLOR": "1"},
    )
    report = done.stdout + done.stderr[-4000:]
    assert done.returncode == 0, report
    counts = re.search(
        rf"{revision}: direct (\d+)/(\d+) checks pass; through mcpool (\d+)/(\d+)", done.stdout
    )
    assert counts is not None, report
    direct, mcpool = int(counts[1]), int(counts[3])
    # Not vacuous: the scenarios ran and mcpool passes at least what the SDK's client does.
    assert direct > 0, report
    assert mcpool >= direct, report
