"""`mcpool demo` as a new user runs it: fast, self-explaining, and leaving nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil

from e2e.harness import kill_leftovers

# Bounds a hung demo only: its promise (under 15 s on a fresh machine) is measured by
# tools/bench/demo.py, not asserted here; a warm run takes about a second.
DEMO_TIMEOUT = 60.0


def test_demo_shows_sharing_and_cleans_up(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCPOOL_", "XDG_"))}
    env["HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-m", "mcpool", "demo"],
        capture_output=True,
        timeout=DEMO_TIMEOUT,
        check=False,
        env=env,
        cwd=home,
    )
    out = done.stdout.decode()
    root = re.search(r"private daemon on (\S+)/daemon\.sock", out)
    try:
        assert done.returncode == 0, out + done.stderr.decode()
        # What each session sees, by policy.
        assert re.search(r"reader\s+includeTools\s+list_notes, search_notes, server_info\n", out)
        assert re.search(
            r"writer\s+excludeTools\s+add_note, list_notes, search_notes, server_info\n", out
        )
        assert re.search(r"admin .* add_note, list_notes, search_notes, delete_note, server", out)
        # One upstream process, and every session's call answered by it.
        shared = re.search(r"one upstream process for all 3 sessions: pid (\d+),.*refs 3", out)
        assert shared, out
        assert f"answered from pid [{shared.group(1)}]" in out
        assert "not listed in includeTools" in out
        # Warm attach next to the cold start of the same server.
        assert re.search(r"cold start of the server itself\s+\d+\.\d ms", out)
        assert re.search(r"warm attach via `mcpool attach`\s+\d+\.\d ms, \d+\.\d ms", out)
        assert re.search(r"done in \d+\.\d s", out)
        # Nothing left: no folder, no process, nothing in the user's config or state.
        assert root is not None
        assert not Path(root.group(1)).exists()
        assert not psutil.pid_exists(int(shared.group(1))) or (
            psutil.Process(int(shared.group(1))).status() == psutil.STATUS_ZOMBIE
        )
        assert list(home.iterdir()) == []
    finally:
        if root is not None:
            kill_leftovers([], [root.group(1)])
