"""A second local user for attack tests (X1, X7): another uid on this machine, as an attacker.

The tests run as root here (CI too), which may create the user: `useradd -M -s /bin/sh`. That
user cannot read the test's 0700 folders, so what it runs is `/usr/bin/python3` (the system's,
not our venv) with a script under a world-readable folder in /tmp.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

OTHER_USER = "mcpool-other"
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int
    scratch: Path  # world-readable: scripts the other user runs go here

    def script(self, name: str, text: str) -> Path:
        path = self.scratch / name
        path.write_text(text)
        path.chmod(0o644)
        return path

    def popen(self, args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start `args` as this user, in its scratch folder, with a minimal environment."""
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.scratch)}
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            args,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            cwd=self.scratch,
            env=env,
            **kwargs,
        )


def other_user_or_skip() -> OtherUser:
    if os.geteuid() != 0:
        pytest.skip("needs root, to make and act as a second local user")
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"needs {SYSTEM_PYTHON}, which a second user can run")
    try:
        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "-M", "-s", "/bin/sh", OTHER_USER], check=True, capture_output=True
        )
        entry = pwd.getpwnam(OTHER_USER)
    assert entry.pw_uid != os.getuid()
    scratch = Path(tempfile.mkdtemp(prefix="mcpool-other-", dir="/tmp"))
    scratch.chmod(0o755)
    os.chown(scratch, entry.pw_uid, entry.pw_gid)
    return OtherUser(OTHER_USER, entry.pw_uid, entry.pw_gid, scratch)
