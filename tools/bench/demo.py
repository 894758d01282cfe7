"""`mcpool demo` end to end, as a new user runs it: wall time against the 15 s promise.

Runs the demo `--runs` times with a fresh HOME each (nothing of the user's is read or written),
the first with no compiled bytecode of mcpool's own (a fresh install compiles on first use), and
reports each run's seconds.

    .venv/bin/python tools/bench/demo.py [--runs 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import median, table, write_result

TARGET_S = 15.0
RUN_TIMEOUT = 120.0  # a hung demo fails the benchmark instead of hanging it


def run_once() -> float:
    home = tempfile.mkdtemp(prefix="mcpool-demo-home-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCPOOL_", "XDG_"))}
    env["HOME"] = home
    try:
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "mcpool", "demo"],
            capture_output=True,
            timeout=RUN_TIMEOUT,
            env=env,
            cwd=home,
            check=False,
        )
        took = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"demo failed: {done.stderr.decode()[-500:]}")
        return took
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # mcpool's layers live in four folders besides mcpool/ itself (an editable install).
    for name in ("mcpool", "mcpool.protocol", "mcpool.pool", "mcpool.session", "mcpool.daemon"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for cache in Path(folder).rglob("__pycache__"):
                shutil.rmtree(cache, ignore_errors=True)
    times = [run_once() for _ in range(args.runs)]
    rows = [
        [f"run {i + 1}" + (" (no bytecode)" if i == 0 else ""), f"{t:.2f}"]
        for i, t in enumerate(times)
    ]
    verdict = "ok" if max(times) <= TARGET_S else "MISS"
    rows.append(["median", f"{median(times):.2f}"])
    print(table(["mcpool demo", f"seconds (target <= {TARGET_S:g}: {verdict})"], rows))
    print("wrote", write_result("demo", {"seconds": times, "target_s": TARGET_S}))


if __name__ == "__main__":
    main()
