"""An installed mcpool works from its own checkout (issue 27): `python -m mcpool` run in the
checkout's root, where `-m` (and `-c`) put the working directory first on sys.path, finds the
installed package, not a folder of the checkout named `mcpool`."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What a checkout holds that an install does not read.
NOT_BUILT = (".git", ".venv", ".peers", "build", "*.egg-info", "__pycache__", ".*_cache", "tests")


@pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None,
    reason="the build backend (setuptools) is not installed in this interpreter",
)
def test_python_m_mcpool_from_the_checkout_root(tmp_path: Path) -> None:
    # A copy of the checkout laid out as `pip install .` installs it, by the build backend's own
    # build_py (what a wheel's purelib holds; offline, where pip would fetch the backend), in a
    # fresh venv. Not editable: the editable finder resolves `mcpool.daemon` for a shadowing
    # folder, a user's venv does not.
    tree = tmp_path / "tree"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(*NOT_BUILT))
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = venv / "lib" / version / "site-packages"
    build = [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q"]
    build += ["build_py", "--build-lib", str(site)]
    built = subprocess.run(build, cwd=tree, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert (site / "mcpool" / "daemon" / "_cli.py").exists()
    python = str(venv / "bin" / "python")

    version_run = subprocess.run(
        [python, "-m", "mcpool", "--version"], cwd=REPO, capture_output=True, timeout=30
    )
    assert version_run.returncode == 0, version_run.stderr.decode()
    assert version_run.stdout.startswith(b"mcpool "), version_run.stdout

    help_run = subprocess.run(
        [python, "-m", "mcpool", "--help"], cwd=REPO, capture_output=True, timeout=30
    )
    assert help_run.returncode == 0, help_run.stderr.decode()
    assert b"setup-client" in help_run.stdout

    where = subprocess.run(
        [python, "-c", "import mcpool, mcpool.daemon; print(mcpool.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout
    # No folder of the checkout may take the name.
    assert not (REPO / "mcpool").exists()
