#!/usr/bin/env bash
# The MCP conformance suite's CLIENT scenarios (0.2.0-alpha, pinned: $PEER_CONFORMANCE_ALPHA_JS),
# each run twice at each revision where it applies:
#   direct:  the `mcp` SDK's own client against the suite's server
#            (tools/conformance_client.py --direct);
#   mcpool:  a private daemon whose only upstream is that server, one session through
#            `mcpool attach` making the same requests (tools/conformance_client.py; for auth/*
#            tests/e2e/oauth_client.py, which logs in as a user does with `daemonctl login`).
# Revisions: 2025-06-18 (the scenarios the suite tags with it), 2025-11-25 and 2026-07-28 (the
# client lists of the suite's frozen requirement sets, requirements/<rev>.yaml, each at its own
# wire; their not-scored entries run too unless they are extensions, shown but never gating).
# Prints a Markdown table per revision (scenario, check, direct, through mcpool) and exits 1 when
# a check of a scored scenario passes directly and not through mcpool, unless KNOWN lists it.
#   tools/conformance_clients.sh [--keep] [REVISION...]
#   SCENARIOS="tools_call auth/*"  only the scenarios matching these shell patterns
#   SCENARIOS="!auth/*"            all but these
#   JOBS=3                         suite runs at once
# The suite's servers listen on every interface: run this in a loopback-only network namespace,
#   unshare -n sh -c 'ip link set lo up && exec tools/conformance_clients.sh'
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -f .peers/env.sh ] || bash tools/peers.sh >&2
# shellcheck disable=SC1091
. .peers/env.sh
KEEP=
if [ "${1:-}" = --keep ]; then KEEP=1; shift; fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mcpool-conformance-clients.XXXXXX")
if [ -z "$KEEP" ]; then trap 'rm -rf "$WORK"' EXIT; else echo "work: $WORK" >&2; fi

# Checks allowed to differ, as "revision/scenario/check" (a shell pattern), each with its reason
# (see README, Conformance: client scenarios). None today.
KNOWN=""

REPO=$REPO WORK=$WORK KNOWN=$KNOWN SUITE=${CONFORMANCE_JS:-$PEER_CONFORMANCE_ALPHA_JS} \
  NODE=$PEER_NODE22 exec "$PY" - "$@" <<'PYEOF'
import fnmatch, json, os, re, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO, WORK = Path(os.environ["REPO"]), Path(os.environ["WORK"])
SUITE, NODE, PY = os.environ["SUITE"], os.environ["NODE"], sys.executable
REVISIONS = sys.argv[1:] or ["2025-06-18", "2025-11-25", "2026-07-28"]
PATTERNS = os.environ.get("SCENARIOS", "").split()
JOBS = int(os.environ.get("JOBS", "3"))
KNOWN = os.environ.get("KNOWN", "").split()
CLIENT_TIMEOUT_MS = 60_000  # the suite's bound on one client run (its default 30 s is tight on a busy box)
# A login through mcpool is a daemon, daemonctl and a browser; scope-retry-limit logs in until
# the daemon's step-up bound stops it (about 30 s on an idle box).
AUTH_CLIENT_TIMEOUT_MS = 150_000
RUN_TIMEOUT = 200  # one suite run: its server, the client, its checks; a hang is a failure
SUITE_DIR = Path(SUITE).resolve().parents[1]


def scenario_lists(revision):
    """(scored, not scored) client scenarios of a revision; extensions are out of scope."""
    req = SUITE_DIR / "requirements" / f"{revision}.yaml"
    if req.exists():
        scored, unscored, section, entry = [], [], None, {}
        for line in req.read_text().splitlines():
            if re.match(r"^\S", line):
                section = line.rstrip(":")
            elif section == "client" and (m := re.match(r"^  - (\S+)$", line)):
                scored.append(m[1])
            elif section == "not_scored":
                if m := re.match(r"^  - scenario: (\S+)$", line):
                    entry = {"scenario": m[1]}
                elif m := re.match(r"^    (leg|reason): (\S+)$", line):
                    entry[m[1]] = m[2]
                    if {"leg", "reason"} <= entry.keys():
                        if entry["leg"] == "client" and entry["reason"] != "extension":
                            unscored.append(entry["scenario"])
        return scored, unscored
    # No requirement set (2025-06-18): the client scenarios the suite tags with the revision.
    out = subprocess.run([NODE, SUITE, "list"], capture_output=True, text=True, timeout=60).stdout
    part = out.split("Client scenarios", 1)[1].split("\n\n", 1)[0]
    return [m[1] for m in re.finditer(r"- (\S+) \[([^\]]*)\]", part) if revision in m[2].split(",")], []


def command(side, scenario):
    if side == "direct":
        return f"{PY} {REPO}/tools/conformance_client.py --direct"
    if scenario.startswith("auth/"):
        return f"{PY} {REPO}/tests/e2e/oauth_client.py"
    return f"{PY} {REPO}/tools/conformance_client.py"


def run(job):
    revision, scenario, side = job
    out = WORK / revision / side / scenario.replace("/", "__")
    out.mkdir(parents=True)
    slow = side == "mcpool" and scenario.startswith("auth/")
    timeout = AUTH_CLIENT_TIMEOUT_MS if slow else CLIENT_TIMEOUT_MS
    argv = [NODE, SUITE, "client", "--command", command(side, scenario), "--scenario", scenario,
            "--spec-version", revision, "--timeout", str(timeout), "-o", str(out)]
    began = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                              env={**os.environ, "NO_COLOR": "1"})
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        text = f"suite run timed out after {RUN_TIMEOUT} s\n{exc.stdout or ''}{exc.stderr or ''}"
    (out / "suite.txt").write_text(text)
    found = [c for path in out.rglob("checks.json") for c in json.loads(path.read_text())
             if c["status"] != "INFO"]  # INFO: the suite's log of requests, not checks
    # One id can stand for several checks: one per tool (ClientRejectsInvalidTool_<tool>), named
    # apart, or one per request, the same name. Each named check is a row; the worst of one
    # name's results counts (a check that passed once and was skipped for later requests passed).
    names = {}
    for c in found:
        names.setdefault(c["id"], set()).add(c.get("name"))
    rank = {"FAILURE": 3, "WARNING": 2, "SUCCESS": 1, "SKIPPED": 0}
    checks = {}
    for c in found:
        key = c["id"] if len(names[c["id"]]) == 1 else f"{c['id']} ({c.get('name')})"
        new = (c["status"], c.get("errorMessage") or "")
        if key not in checks or rank.get(new[0], 3) > rank.get(checks[key][0], 3):
            checks[key] = new
    # The suite's verdict on the run as a whole: its checks, and the client's exit (a client
    # that failed where the scenario does not allow it fails the scenario).
    overall = "SUCCESS" if "OVERALL: PASSED" in text else "FAILURE"
    said = "".join(p.read_text(errors="replace")[-1500:] for p in out.rglob("std*.txt"))
    checks["(overall)"] = (overall, "" if overall == "SUCCESS" else f"{text[-1500:]}\n{said}")
    return job, checks, time.monotonic() - began


jobs, scored = [], {}
for revision in REVISIONS:
    required, unscored = scenario_lists(revision)
    for scenario in required + unscored:
        wanted = [p for p in PATTERNS if not p.startswith("!")]
        if wanted and not any(fnmatch.fnmatchcase(scenario, p) for p in wanted):
            continue
        if any(fnmatch.fnmatchcase(scenario, p[1:]) for p in PATTERNS if p.startswith("!")):
            continue
        scored[(revision, scenario)] = scenario in required
        jobs += [(revision, scenario, "direct"), (revision, scenario, "mcpool")]
if not jobs:
    sys.exit("conformance_clients: no scenarios selected")
# Slowest first (auth through mcpool logs in with daemonctl), so the pool ends together.
jobs.sort(key=lambda j: (j[2] != "mcpool", not j[1].startswith("auth/")))
with ThreadPoolExecutor(JOBS) as pool:
    results = {job: (checks, secs) for job, checks, secs in pool.map(run, jobs)}

mark = {"SUCCESS": "pass", "FAILURE": "FAIL", "WARNING": "warn", "SKIPPED": "skip", "INFO": "info"}
regressions, explained = [], []
for revision in REVISIONS:
    keys = [k for k in scored if k[0] == revision]
    if not keys:
        continue
    print(f"\n### {revision}\n")
    print("| scenario | check | direct | through mcpool |")
    print("|---|---|---|---|")
    counts = {"direct": [0, 0], "mcpool": [0, 0]}
    for _, scenario in keys:
        direct = results[(revision, scenario, "direct")][0]
        mcpool = results[(revision, scenario, "mcpool")][0]
        for check in list(direct) + [c for c in mcpool if c not in direct]:
            d = direct.get(check, ("-", ""))[0]
            m = mcpool.get(check, ("-", ""))[0]
            for side, status in (("direct", d), ("mcpool", m)):
                counts[side][1] += 1
                counts[side][0] += status == "SUCCESS"
            note = "" if scored[(revision, scenario)] else " (not scored)"
            # A check the suite skips (e.g. a capability mcpool's own requests do not declare)
            # did not fail; one missing through mcpool did.
            if d == "SUCCESS" and m not in ("SUCCESS", "SKIPPED") and scored[(revision, scenario)]:
                key = f"{revision}/{scenario}/{check}"
                if any(fnmatch.fnmatchcase(key, p) for p in KNOWN):
                    explained.append((key, mcpool.get(check, ("", ""))[1]))
                    note = " (known)"
                else:
                    regressions.append((key, mcpool.get(check, ("", ""))[1]))
                    note = " (REGRESSION)"
            print(f"| {scenario} | {check} | {mark.get(d, d)} | {mark.get(m, m)}{note} |")
    print(f"\n{revision}: direct {counts['direct'][0]}/{counts['direct'][1]} checks pass; "
          f"through mcpool {counts['mcpool'][0]}/{counts['mcpool'][1]}")
slow = sorted(((secs, job) for job, (_, secs) in results.items()), reverse=True)[:3]
print("\nslowest runs: " + ", ".join(f"{'/'.join(j)} {s:.0f} s" for s, j in slow))
for key, why in explained:
    print(f"known difference: {key}: {why[:300]}")
for key, why in regressions:
    print(f"REGRESSION: {key}: {why[:1500]}")
sys.exit(1 if regressions else 0)
PYEOF
