"""The comparison tools/conformance.sh prints: one Markdown table per revision of every check the
conformance suite reported, directly and through mcpool's two upstream transports, then the
counts; exits 1 when a check that passes directly does not pass through mcpool and is not listed
in $KNOWN (space-separated `revision/scenario/check`).

    python tools/conformance_table.py [--scenarios] RESULTS REVISION...

`--scenarios`: only a table per revision of each scenario's passing checks per endpoint (what
README.md shows), no verdict.

RESULTS/REVISION/{direct,stdio,http}/<scenario>-<timestamp>/checks.json are the suite's `-o`
output.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ENDPOINTS = ("direct", "stdio", "http")
# Two suite runs at once on one pooled stdio upstream (handshake revisions): compared with direct.
TWICE = ("twice-a", "twice-b")
MARK = {"SUCCESS": "pass", "FAILURE": "FAIL", "WARNING": "warn", "SKIPPED": "skip", "INFO": "info"}
Key = tuple[str, str]


def results(root: Path) -> dict[Key, tuple[str, str]]:
    """(scenario, check) -> (status, error message) of one suite run."""
    out: dict[Key, tuple[str, str]] = {}
    for checks in sorted(root.glob("*/checks.json")):
        scenario = re.sub(r"^server-|-\d{4}-\d\d-\d\dT.*$", "", checks.parent.name)
        for check in json.loads(checks.read_text()):
            out[(scenario, check["id"])] = (check["status"], check.get("errorMessage") or "")
    return out


def compare(
    revision: str, runs: dict[str, dict[Key, tuple[str, str]]], known: set[str]
) -> list[str]:
    """Print the revision's table; return its regressions as lines to report."""
    direct = runs["direct"]
    print(f"\n### {revision}\n")
    print("| scenario | check | direct | via stdio upstream | via HTTP upstream |")
    print("|---|---|---|---|---|")
    problems: list[str] = []
    keys = list(direct) + sorted(set().union(*runs.values()) - set(direct))
    for key in keys:
        cells = []
        for name in ENDPOINTS:
            status, message = runs[name].get(key, ("-", ""))
            cell = MARK.get(status, status)
            if name != "direct" and direct.get(key, ("-",))[0] == "SUCCESS" and status != "SUCCESS":
                label = f"{revision}/{key[0]}/{key[1]}"
                if label in known:
                    cell += " (known)"
                else:
                    cell += " (REGRESSION)"
                    problems.append(f"REGRESSION {label} via {name}: {message}")
            cells.append(cell)
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    print()
    twice = [name for name in TWICE if name in runs]
    if twice:
        print(
            "\nTwo suites at once on one pooled stdio upstream, where either differs from direct:\n"
        )
        print("| scenario | check | direct | " + " | ".join(twice) + " |")
        print("|---|---|---|" + "---|" * len(twice))
        for key in keys:
            base = direct.get(key, ("-",))[0]
            statuses = [runs[name].get(key, ("-", ""))[0] for name in twice]
            if all(status == base for status in statuses):
                continue
            cells = [MARK.get(status, status) for status in statuses]
            for name, status in zip(twice, statuses, strict=True):
                if base == "SUCCESS" and status != "SUCCESS":
                    label = f"{revision}/{key[0]}/{key[1]}"
                    if label not in known:
                        message = runs[name].get(key, ("", ""))[1]
                        problems.append(f"REGRESSION {label} via {name}: {message}")
            print(f"| {key[0]} | {key[1]} | {MARK.get(base, base)} | " + " | ".join(cells) + " |")
    for name in (*ENDPOINTS, *twice):
        run = runs[name]
        passed = sum(1 for status, _ in run.values() if status == "SUCCESS")
        print(f"{revision} {name}: {passed}/{len(run)} checks pass")
    return problems


def by_scenario(revision: str, runs: dict[str, dict[Key, tuple[str, str]]]) -> None:
    print(f"\n{revision}:\n")
    print("| scenario | direct | via stdio upstream | via HTTP upstream |")
    print("|---|---|---|---|")
    scenarios = list(dict.fromkeys(key[0] for key in runs["direct"]))
    for scenario in scenarios:
        cells = []
        for name in ENDPOINTS:
            statuses = [status for key, (status, _) in runs[name].items() if key[0] == scenario]
            passed = sum(1 for status in statuses if status == "SUCCESS")
            cells.append(f"{passed}/{len(statuses)}")
        print(f"| {scenario} | " + " | ".join(cells) + " |")


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--scenarios":
        root = Path(args[1])
        for revision in args[2:]:
            by_scenario(revision, {name: results(root / revision / name) for name in ENDPOINTS})
        return
    root, revisions = Path(args[0]), args[1:]
    known = set(os.environ.get("KNOWN", "").split())
    problems: list[str] = []
    for revision in revisions:
        runs = {name: results(root / revision / name) for name in ENDPOINTS}
        if revision != "2026-07-28":  # (tools/conformance.sh runs the two at handshake ones)
            for name in TWICE:
                runs[name] = results(root / revision / name)
        empty = [name for name, run in runs.items() if not run]
        if empty:
            problems.append(f"{revision}: no results from {', '.join(empty)}")
            continue
        problems += compare(revision, runs, known)
    for line in problems:
        print(line)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
