"""The official conformance suite's client scenarios with mcpool as the client.

`conformance client --command CMD --scenario NAME` starts the suite's own test server and runs
CMD with its URL last; CMD (tools/conformance_client.py) starts a private daemon whose only
upstream is that URL and drives a session through `mcpool attach`. The suite's servers listen
on every interface, so each run happens in a loopback-only network namespace (`unshare -n`,
root only). `sse-retry` is SEP-1699 polling: a tool call's response stream ended on purpose
after a priming event, resumed by GET with Last-Event-ID after `retry` ms (issue 15, point 3).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import trio

from .harness import REPO

pytestmark = [pytest.mark.peers, pytest.mark.slow]

# One scenario: node and the suite start (~1 s), the daemon and attach start (~1 s), the calls;
# the suite's own client timeout is 30 s.
SCENARIO_TIMEOUT = 60.0
CLIENT = REPO / "tools" / "conformance_client.py"


@pytest.mark.skipif(os.geteuid() != 0, reason="a loopback-only network namespace needs root")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.parametrize("scenario", ["initialize", "tools_call", "sse-retry"])
async def test_conformance_client_scenario_passes_through_mcpool(
    peers: dict[str, str], scenario: str
) -> None:
    command = f"{sys.executable} {CLIENT}"
    suite = f"{peers['PEER_NODE22']} {peers['PEER_CONFORMANCE_JS']}"
    script = f"ip link set lo up && exec {suite} client --command '{command}' --scenario {scenario}"
    with trio.fail_after(SCENARIO_TIMEOUT):
        done = await trio.run_process(
            ["unshare", "-n", "sh", "-c", script],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "NO_COLOR": "1"},
        )
    output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert done.returncode == 0, output
    assert "OVERALL: PASSED" in output, output
    assert "0 failed, 0 warnings" in output, output


def test_the_client_script_needs_a_url() -> None:
    done = subprocess.run(
        [sys.executable, str(CLIENT)], capture_output=True, check=False, timeout=30
    )
    assert done.returncode == 2
    assert b"usage" in done.stderr
