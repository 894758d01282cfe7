"""Remote servers from the plain install (issue 28 item 2): `pip install .` with no extras, in a
fresh venv, runs an HTTP upstream and `mcpool daemon --http`.

One daemon of that venv serves the fake stdio server on its own streamable HTTP endpoint
(`--http`); a second daemon of the same venv has that endpoint as an `httpUrl` server, and a
session attached through the venv's own `mcpool attach` lists and calls its tool. Nothing of the
test's interpreter runs mcpool here: without httpx2 the second daemon cannot reach the first, and
without h11 the first refuses `--http`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import REPO, DaemonFactory, fake_server
from .support import call_text, servers_of, tool_names
from .test_http import free_port, wait_listening

# What a checkout holds that an install does not read (and must not be built into).
NOT_BUILT = (".git", ".venv", ".peers", "build", "*.egg-info", "__pycache__", ".*_cache", "tests")
# pip resolves and installs the dependencies (from the index, or its cache): about 10 s here.
INSTALL_TIMEOUT = 600


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding `pip install .` of this checkout, no extras; its python."""
    root = tmp_path_factory.mktemp("plain")
    tree = root / "tree"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(*NOT_BUILT))
    venv = root / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(tree)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, done.stderr
    # The plain install: the optional keyring is not there, the test extras neither.
    check = "import importlib.util as u; print(u.find_spec('keyring'), u.find_spec('pytest'))"
    found = subprocess.run([str(python), "-c", check], capture_output=True, text=True, timeout=30)
    assert found.stdout.split() == ["None", "None"], found.stdout
    return python


async def test_plain_install_runs_an_http_upstream_and_http_endpoint(
    plain_venv: Path, daemon_factory: DaemonFactory
) -> None:
    python = str(plain_venv)
    serving = await daemon_factory({"fake": fake_server()}, start=False, python=python)
    port = free_port()
    argv = serving.argv()
    serving.argv = lambda: [*argv, "--http", f"127.0.0.1:{port}"]  # type: ignore[method-assign]
    await serving.start()
    assert serving.process is not None
    await wait_listening(port, serving.process, serving.stderr_path)

    remote = await daemon_factory(python=python)
    settings = remote.settings_file(
        "r.json", {"remote": {"httpUrl": f"http://127.0.0.1:{port}/mcp"}}
    )
    async with remote.attach([settings], "one") as one:
        assert "remote__fake__echo" in await tool_names(one)
        text = await call_text(one, "remote__fake__echo", {"text": "through two daemons"})
        assert text == "through two daemons"
        (entry,) = await servers_of(remote)
        assert entry["state"] == "active", entry
