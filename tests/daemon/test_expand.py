"""daemon/_expand.py: `${VAR}` expansion, value checks and self-launch detection (pure), and
the base environment of stdio upstreams (pool/_environ.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mcpool.daemon import _attach
from mcpool.daemon._expand import (
    check_values,
    expand_entry,
    expand_text,
    referenced_names,
    self_launch,
)
from mcpool.pool import ServerSettings, _guardian
from mcpool.pool._environ import (
    SPAWN_MARKER,
    UPSTREAM_MARKER,
    base_environment,
    upstream_environment,
)
from mcpool.protocol import SettingsError


def entry(**fields: Any) -> ServerSettings:
    return msgspec.convert(fields, ServerSettings)


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A}", {"A": "1"}, "1"),
        ("x-${A}-${B}", {"A": "1", "B": "2"}, "x-1-2"),
        ("${A:-dflt}", {}, "dflt"),
        ("${A:-}", {}, ""),
        ("${A:-dflt}", {"A": ""}, ""),  # set wins, even empty (Claude Code's rule)
        ("${A:-a:-b}", {}, "a:-b"),
        ("$A ${input:x} ${env:A} $${", {"A": "1"}, "$A ${input:x} ${env:A} $${"),
        ("no references", {}, "no references"),
    ],
)
def test_expand_text(text: str, env: dict[str, str], expected: str) -> None:
    assert expand_text(text, env) == expected


def test_every_expandable_field_is_expanded() -> None:
    env = {"BIN": "/opt/bin", "TOKEN": "t0k", "DIR": "/srv", "HOST": "h.example"}
    stdio = expand_entry(
        "s",
        entry(
            command="${BIN}/server",
            args=["--dir", "${DIR}"],
            env={"API_TOKEN": "${TOKEN}"},
            cwd="${DIR}/work",
        ),
        env,
        "/p/.mcp.json",
    )
    assert (stdio.command, stdio.args, stdio.env, stdio.cwd) == (
        "/opt/bin/server",
        ["--dir", "/srv"],
        {"API_TOKEN": "t0k"},
        "/srv/work",
    )
    remote = expand_entry(
        "r",
        entry(
            httpUrl="https://${HOST}/mcp",
            url="https://${HOST}/sse",
            headers={"Authorization": "Bearer ${TOKEN}"},
        ),
        env,
        "/p/.mcp.json",
    )
    assert (remote.http_url, remote.url, remote.headers) == (
        "https://h.example/mcp",
        "https://h.example/sse",
        {"Authorization": "Bearer t0k"},
    )


def test_an_entry_without_references_is_returned_as_is() -> None:
    plain = entry(command="x", args=["a"], env={"K": "v"})
    assert expand_entry("s", plain, {}, "f") is plain


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": "${NOPE}"}, "command"),
        ({"command": "x", "args": ["ok", "${NOPE}"]}, "args[1]"),
        ({"command": "x", "env": {"KEY": "${NOPE}"}}, "env.KEY"),
        ({"command": "x", "cwd": "${NOPE}/d"}, "cwd"),
        ({"httpUrl": "https://${NOPE}/mcp"}, "httpUrl"),
        ({"url": "https://x", "headers": {"X-Key": "${NOPE}"}}, "headers.X-Key"),
    ],
)
def test_an_unset_variable_without_default_names_server_file_field_and_variable(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        expand_entry("srv", entry(**fields), {"OTHER": "1"}, "/proj/.mcp.json")
    exc = caught.value
    assert (exc.server, exc.path, exc.field) == ("srv", "/proj/.mcp.json", field)
    assert "${NOPE} is not set" in exc.reason
    assert "/proj/.mcp.json" in exc.message and "'srv'" in exc.message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"url": "https://x", "headers": {"Auth": "Bearer s3cret\n"}}, "headers.Auth"),
        ({"url": "https://x", "headers": {"Auth": "a\r\nX-Evil: 1"}}, "headers.Auth"),
        ({"url": "https://x", "headers": {"X-K": "v\x00"}}, "headers.X-K"),
        ({"url": "https://x", "headers": {"X-K": "snow\u2603man"}}, "headers.X-K"),
        ({"url": "https://x", "headers": {"X-K": "caf\u00e9"}}, "headers.X-K"),
        ({"url": "https://x", "headers": {"Bad Name": "v"}}, "headers.Bad Name"),
        ({"command": "x", "env": {"K": "a\x00b"}}, "env.K"),
        ({"command": "x", "env": {"A=B": "v"}}, "env.A=B"),
        ({"command": "x", "args": ["a\x00"]}, "args[0]"),
        ({"httpUrl": "https://x/mcp\n"}, "httpUrl"),
    ],
)  # fmt: skip
def test_values_that_cannot_be_sent_are_refused_without_quoting_them(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        check_values("srv", entry(**fields), "/p/settings.json")
    exc = caught.value
    assert (exc.server, exc.path, exc.field) == ("srv", "/p/settings.json", field)
    assert "s3cret" not in str(exc.to_error_object())


def test_ordinary_values_pass_the_checks() -> None:
    check_values(
        "ok",
        entry(url="https://x/mcp", headers={"Authorization": "Bearer a.b-c", "X-T": "tab\there"}),
        "f",
    )
    check_values("ok", entry(command="x", args=["--a", "ünïcode"], env={"K": "ünï\ncode"}), "f")


@pytest.mark.parametrize(
    "words",
    [
        ["mcpool", "attach"],
        ["/home/u/.local/bin/mcpool", "attach", "--name", "x"],
        ["python3", "-m", "mcpool", "attach"],
        [sys.executable, "-m", "mcpool", "attach", "--socket", "/s"],
        ["uvx", "mcpool", "attach"],
    ],
)
def test_an_entry_that_launches_mcpool_attach_is_recognised(words: list[str]) -> None:
    reason = self_launch(entry(command=words[0], args=words[1:]))
    assert reason is not None and "launches mcpool itself" in reason


def test_this_installs_script_under_another_name_is_recognised(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "mcpool"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    alias = tmp_path / "mcp-bridge"
    alias.symlink_to(script)
    found = self_launch(entry(command=str(alias), args=["attach"]), str(script.resolve()))
    assert found is not None


@pytest.mark.parametrize(
    "words",
    [
        ["mcpool", "example-server"],
        ["python3", "-m", "mcpool", "demo"],
        ["npx", "-y", "@modelcontextprotocol/server-filesystem", "."],
        ["attach"],
    ],
)
def test_other_commands_are_not_self_launches(words: list[str]) -> None:
    assert self_launch(entry(command=words[0], args=words[1:]), "/nonexistent/mcpool") is None


def test_the_bridge_scans_for_references_like_the_daemon(tmp_path: Path, monkeypatch: Any) -> None:
    text = b'{"a": "${SET_ONE}", "b": "${UNSET_ONE:-x}", "c": "$NOT_THIS ${input:nor}"}'
    assert referenced_names(text) == {"SET_ONE", "UNSET_ONE"}
    path = tmp_path / ".mcp.json"
    path.write_bytes(text)
    monkeypatch.setenv("SET_ONE", "v1")
    monkeypatch.delenv("UNSET_ONE", raising=False)
    monkeypatch.setenv("UNREFERENCED_SECRET", "s")
    sent = _attach.referenced_environment([str(path), str(tmp_path / "missing.json")])
    assert sent == {"SET_ONE": "v1"}


def test_the_bridge_and_the_daemon_agree_on_the_marker() -> None:
    assert _attach.UPSTREAM_MARKER == UPSTREAM_MARKER
    assert _attach.SPAWN_MARKER == SPAWN_MARKER
    assert UPSTREAM_MARKER.encode() == _guardian.UPSTREAM_MARKER


def test_the_base_environment_is_an_allowlist() -> None:
    daemon_env = {
        "HOME": "/home/u",
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_TIME": "C",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "HTTPS_PROXY": "http://proxy:3128",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "AWS_PROFILE": "prod",
        "GITHUB_TOKEN": "ghp_x",
        "VIRTUAL_ENV": "/proj/.venv",
        "MCPOOL_SOCKET": "/s",
    }
    assert set(base_environment(daemon_env)) == {
        "HOME", "PATH", "LANG", "LC_TIME", "XDG_RUNTIME_DIR", "HTTPS_PROXY", "SSL_CERT_FILE",
    }  # fmt: skip
    env = upstream_environment(
        (("AWS_PROFILE", "dev"), (UPSTREAM_MARKER, "0")), environ=daemon_env, daemon_pid=42
    )
    assert env["AWS_PROFILE"] == "dev"  # the entry's env is added
    assert env[UPSTREAM_MARKER] == "42"  # and no entry can unset the marker
    assert "GITHUB_TOKEN" not in env


@pytest.mark.parametrize("client", ["claude-code", "vscode", "cursor", "claude-desktop"])
def test_the_entry_setup_client_writes_is_a_self_launch(client: str) -> None:
    from mcpool.daemon._setup import mcpool_command, server_entry

    written = server_entry(client, mcpool_command())
    fields = {k: v for k, v in written.items() if k in ("command", "args")}
    assert self_launch(entry(**fields)) is not None
