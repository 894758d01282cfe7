"""Running mcpool's own commands as a user would, in a private home (no MCPOOL_/XDG_ variables
of the test run leak in)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COMMAND_TIMEOUT = 30.0  # a command of these tests ends in well under a second; this bounds a hang


def mcpool(
    *args: str, home: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m mcpool ARGS` with HOME=home (and `env`), run in `cwd` (default: home)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MCPOOL_", "XDG_"))}
    env = {**base, "HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mcpool", *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
        env=env,
        cwd=cwd or home,
    )
