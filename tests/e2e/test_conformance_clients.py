"""Issue 18 acceptance: the 0.2.0-alpha conformance suite's client scenarios, with mcpool as the
client, each compared with the same scenario run by the SDK's own client directly.

`tools/conformance_clients.sh REVISION` runs every client scenario the suite has for that
revision (2025-06-18 by its tags; 2025-11-25 and 2026-07-28 by the suite's frozen requirement
sets) twice: `tools/conformance_client.py --direct` (the `mcp` SDK's client against the suite's
server) and `tools/conformance_client.py` (a private daemon whose only upstream is that server,
one session through `mcpool attach` making the same requests). It exits 1 when a check of a
scored scenario passes directly and not through mcpool. The suite's servers listen on every
interface, so the runner runs in a loopback-only network namespace (`unshare -n`, root).

Per revision, the wire scenarios (initialize, tools_call, sse-retry, elicitation defaults,
request-metadata, sep-2322 request state, the SEP-2243 standard, custom and invalid-tool
headers, JSON Schema ones); and the auth/* scenarios 2026-07-28 added (issuer checks, resource
mismatch, offline access, authorization server migration), each logging in through the broker
as `daemonctl login` does. The auth/* scenarios older revisions share with 0.1.16 are
tests/e2e/test_oauth_conformance.py's; the whole set is a run of the script by hand (README,
Conformance: client scenarios).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from .harness import REPO

pytestmark = [pytest.mark.peers, pytest.mark.slow]

RUNNER = REPO / "tools" / "conformance.sh"  # --clients: tools/conformance_clients.sh
# Every scenario of a revision twice, three suite runs at once (each one node, a daemon and an
# SDK client); about 20 to 40 s here, more on a busy box. A hang is a failure.
RUN_TIMEOUT = 300.0


# The auth/* client scenarios the 2026-07-28 requirement set added (the older ones run at 0.1.16
# in test_oauth_conformance.py): about a minute through the broker's logins, three at a time.
AUTH_2026 = (
    "auth/iss-* auth/resource-mismatch auth/offline-access-* auth/authorization-server-migration"
    " auth/metadata-issuer-mismatch"
)


def _run_clients(revision: str, scenarios: str) -> tuple[int, int, str]:
    """Run the client scenarios matching `scenarios` at `revision` in a loopback-only network
    namespace; (checks passing directly, checks passing through mcpool, the report). Fails
    when a check that passes directly fails through mcpool (the runner's exit status)."""
    done = subprocess.run(
        [
            "unshare",
            "-n",
            "sh",
            "-c",
            'ip link set lo up && exec "$@"',
            "sh",
            str(RUNNER),
            "--clients",
            revision,
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={**os.environ, "SCENARIOS": scenarios, "NO_COLOR": "1"},
    )
    report = done.stdout + done.stderr[-4000:]
    assert done.returncode == 0, report
    counts = re.search(
        rf"{revision}: direct (\d+)/(\d+) checks pass; through mcpool (\d+)/(\d+)", done.stdout
    )
    assert counts is not None, report
    return int(counts[1]), int(counts[3]), report


needs_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a loopback-only network namespace needs root and unshare (util-linux)",
)


@needs_namespace
@pytest.mark.parametrize("revision", ["2025-06-18", "2025-11-25", "2026-07-28"])
def test_no_client_check_that_passes_directly_fails_through_mcpool(
    peers: dict[str, str], revision: str
) -> None:
    assert peers["PEER_CONFORMANCE_ALPHA_JS"]
    direct, mcpool, report = _run_clients(revision, "!auth/*")
    # Not vacuous: the scenarios ran and mcpool passes at least what the SDK's client does.
    assert direct > 0, report
    assert mcpool >= direct, report


@needs_namespace
def test_the_2026_auth_scenarios_pass_through_the_broker_as_directly(
    peers: dict[str, str],
) -> None:
    assert peers["PEER_CONFORMANCE_ALPHA_JS"]
    direct, mcpool, report = _run_clients("2026-07-28", AUTH_2026)
    assert direct > 0, report
    assert mcpool >= direct, report
    assert "auth/iss-wrong-issuer" in report and "auth/resource-mismatch" in report, report
