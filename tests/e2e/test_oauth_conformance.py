"""Issue 16 acceptance: the conformance suite's client auth scenarios, with mcpool as the client.

`conformance client --scenario auth/...` starts the suite's authorization and MCP servers (whose
authorization endpoint approves at once) and runs `oauth_client.py`, which drives a private
daemon as a user would: a session attaches, `daemonctl servers` shows `needs-login`,
`daemonctl login` opens the URL with `$BROWSER` (a fetcher that follows the redirect to the
daemon's loopback listener), the session gets the server's tools and calls one. The suite's
servers listen on every interface, so each run is inside a loopback-only network namespace.

Besides the suite's verdict, every run checks X2: no access token appears in the daemon's log
(at debug level), its stderr, or anything daemonctl printed; and the file store's records are
0600.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("oauth_client.py")
# A scenario is a few dozen HTTP exchanges plus a daemon start; a hang is a failure.
SCENARIO_TIMEOUT = 150.0
CLIENT_TIMEOUT_MS = 90_000  # the suite's own bound on the driver (its default is 30 s)

# Every scenario of the 2025-11-25, 2025-06-18 and 2025-03-26 specs, and the draft ones.
SCENARIOS = [
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
]
# Scenarios whose right outcome is a refusal (no authorization, or no more of them): the client
# exits with an error.
REFUSED = {"auth/resource-mismatch", "auth/scope-retry-limit"}
# The suite's tokens: "test-token-<ms>" ("test-token" in the endpoint fallback scenario).
TOKEN_MARK = "test-token"

pytestmark = [pytest.mark.peers, pytest.mark.slow]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_auth_scenario(scenario: str, peers: dict[str, str], tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip for a loopback-only network namespace")
    results = tmp_path / "results"
    artifacts = tmp_path / "artifacts"
    command = [
        "unshare",
        "-n",
        "sh",
        "-c",
        'ip link set lo up && exec "$@"',
        "sh",
        peers["PEER_NODE22"],
        peers["PEER_CONFORMANCE_JS"],
        "client",
        "--command",
        f"{sys.executable} {DRIVER}",
        "--scenario",
        scenario,
        "--timeout",
        str(CLIENT_TIMEOUT_MS),
        "-o",
        str(results),
    ]
    proc = subprocess.run(
        command,
        env={**os.environ, "MCPOOL_OAUTH_ARTIFACTS": str(artifacts)},
        capture_output=True,
        text=True,
        timeout=SCENARIO_TIMEOUT,
    )
    report = proc.stdout + proc.stderr
    checks = json.loads(next(results.rglob("checks.json")).read_text())
    bad = [c for c in checks if c["status"] in ("FAILURE", "WARNING")]
    assert not bad, f"{scenario}: {json.dumps(bad, indent=1)}\n{report[-4000:]}"
    assert "OVERALL: PASSED" in report, report[-4000:]

    said = {p.name: p.read_text(errors="replace") for p in artifacts.iterdir() if p.is_file()}
    assert "daemon.log" in said, sorted(said)
    for name, text in said.items():
        assert TOKEN_MARK not in text, f"a token in {name}"
    if scenario in REFUSED:
        return
    assert "authorized" in said["daemon.log"], said["daemon.log"][-2000:]
    facts = json.loads(said["facts.json"])
    # The session got the server's tools by list_changed once it was authorized.
    assert facts["tools_list_changed"] >= 1, facts
    # One record, 0600 (no keyring backend here); logout removed it.
    assert facts["records_before_logout"] == 1, facts
    assert set(facts["modes"].values()) == {"0o600"}, facts
    assert facts["logout"] is True, facts
    assert facts["records_after_logout"] == 0, facts
