"""Fixtures shared by every test package; the e2e machinery itself lives in e2e/harness.py."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from e2e.harness import DaemonFactory, load_peers
from other_user import OtherUser, other_user_or_skip


@pytest.fixture
async def daemon_factory(tmp_path: Path) -> AsyncIterator[DaemonFactory]:
    """`await daemon_factory(servers, daemon=..., env=...)` -> a started DaemonProcess.

    Teardown SIGKILLs every daemon still running and every process that mentions this test's
    paths, whether or not the test stopped them cleanly.
    """
    factory = DaemonFactory(tmp_path)
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture(scope="session")
def peers() -> dict[str, str]:
    """The PEER_* paths from .peers/env.sh, installing the peers first when they are missing.

    Skips only when MCPOOL_SKIP_PEERS=1: a missing peer is otherwise a failure, so CI cannot
    go green by silently skipping the interoperability tests.
    """
    if os.environ.get("MCPOOL_SKIP_PEERS") == "1":
        pytest.skip("MCPOOL_SKIP_PEERS=1")
    return load_peers()


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A non-blocking pipe (read end, write end); either end a test closes is fine."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short private folder for Unix sockets (not tmp_path: a socket path must fit in 108
    bytes)."""
    path = Path(tempfile.mkdtemp(prefix="mcpt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's daemons keep discovery snapshots in its own folder, never ~/.cache (a
    snapshot left by one test would change what the next one's sessions see first)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The cyclic garbage collector off for the test: what reference counting alone does not
    free stays (the daemon collects seldom, so a reference cycle per session or connection is
    memory that grows under churn)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    """A second local user (tests/other_user.py), with a world-readable scratch folder."""
    user = other_user_or_skip()
    try:
        yield user
    finally:
        shutil.rmtree(user.scratch, ignore_errors=True)
