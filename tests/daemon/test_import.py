"""`mcpool import`: each client's format (samples/), the notes, merging, and the CLI."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from commands import mcpool

from mcpool.daemon._import import convert, loads_jsonc, merge

SAMPLES = Path(__file__).with_name("samples")


def _convert(client: str, relative: str) -> tuple[dict[str, Any], list[str]]:
    path = SAMPLES / relative
    return convert(client, loads_jsonc(path.read_text()), path)


def test_claude_code_project_file() -> None:
    servers, notes = _convert("claude-code", "claude-code/.mcp.json")
    project = str(SAMPLES / "claude-code")
    assert servers == {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "cwd": project},
        "github": {
            "type": "http",
            "url": "https://api.githubcopilot.com/mcp/",
            "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
        },
        "events": {"type": "sse", "url": "http://127.0.0.1:9000/sse"},
        "files": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "./docs"],
            "env": {"LOG_LEVEL": "debug"},
            "cwd": project,
        },
    }
    assert "mcpool: skipped, it is mcpool itself" in notes
    # ${GITHUB_TOKEN} is carried over as written: the daemon expands it from the session's
    # environment, as Claude Code did.
    assert not any("GITHUB_TOKEN" in n for n in notes), notes


def test_claude_code_user_file_skips_project_scoped_servers() -> None:
    servers, notes = _convert("claude-code", "claude.json")
    assert list(servers) == ["memory"]
    assert "cwd" not in servers["memory"]  # a user-scope server: no project to run in
    (note,) = notes
    assert "/home/u/work/site (db) are not imported" in note


def test_claude_desktop() -> None:
    servers, notes = _convert("claude-desktop", "claude_desktop_config.json")
    assert servers["weather"] == {
        "command": "python3",
        "args": ["/opt/weather/server.py"],
        "env": {"API_KEY": "k-123"},
    }
    assert set(servers) == {"filesystem", "weather"}
    assert notes == []


def test_vscode_servers_with_type_inputs_and_comments() -> None:
    servers, notes = _convert("vscode", "vscode/.vscode/mcp.json")
    project = str(SAMPLES / "vscode")
    assert set(servers) == {"perplexity", "fetch", "github", "dev-server"}
    assert servers["fetch"] == {
        "type": "stdio",
        "command": "uvx",
        "args": ["mcp-server-fetch", "--root", project],  # ${workspaceFolder} resolved
        "cwd": project,
    }
    assert servers["github"] == {"type": "http", "url": "https://api.githubcopilot.com/mcp/"}
    assert "envFile" not in servers["perplexity"]
    text = "\n".join(notes)
    assert "input prompts (perplexity-key)" in text
    assert "perplexity: envFile" in text
    assert "perplexity: env.PERPLEXITY_API_KEY holds a VS Code ${input:...} variable" in text
    assert "sock: skipped, transport type 'ws' is not supported" in text
    assert "dev-server: VS Code's dev (watch/debug) settings ignored" in text


def test_cursor_url_becomes_streamable_http() -> None:
    servers, notes = _convert("cursor", "cursor/mcp.json")
    assert servers["remote"] == {
        "type": "http",
        "url": "https://mcp.example.com/mcp",
        "headers": {"X-Team": "blue"},
    }
    assert servers["linear"]["disabled"] is True
    text = "\n".join(notes)
    assert 'remote: url without "type": imported as streamable HTTP' in text
    assert "web-search: env.KEY holds an ${env:...} variable" in text


def test_gemini_fields_are_mcpools_own() -> None:
    servers, notes = _convert("gemini", "gemini-settings.json")
    python_tools = servers["pythonTools"]
    assert python_tools["includeTools"] == ["safe_tool", "run_shell_command(git status)"]
    assert (python_tools["trust"], python_tools["timeout"]) == (False, 15000)
    assert servers["httpServer"] == {
        "httpUrl": "http://localhost:3000/mcp",
        "timeout": 5000,
        "excludeTools": ["dangerous_tool"],
    }
    assert servers["sseServer"] == {"url": "http://localhost:8081/sse", "trust": True}
    assert servers["gcp"] == {
        "httpUrl": "https://my-gcp-service.run.app/mcp",
        "oauth": {"scopes": ["https://www.googleapis.com/auth/userinfo.email"]},
    }
    assert servers["legacy"]["disabled"] is True
    text = "\n".join(notes)
    assert "gcp: authProviderType not carried over" in text
    assert "pythonTools: cwd './mcp-servers/python' is relative" in text
    assert "env.DATABASE_URL holds a $ followed by a name" in text
    assert "legacy: imported disabled" in text


def test_every_sample_converts_to_settings_the_daemon_accepts() -> None:
    from mcpool.daemon._settings import parse_settings

    for client, relative in [
        ("claude-code", "claude-code/.mcp.json"),
        ("claude-code", "claude.json"),
        ("claude-desktop", "claude_desktop_config.json"),
        ("vscode", "vscode/.vscode/mcp.json"),
        ("cursor", "cursor/mcp.json"),
        ("gemini", "gemini-settings.json"),
        ("copilot", "copilot/mcp-config.json"),
        ("opencode", "opencode/opencode.jsonc"),
        ("cline", "cline/cline_mcp_settings.json"),
    ]:
        servers, _ = _convert(client, relative)
        assert servers, (client, relative)
        parse_settings(json.dumps({"mcpServers": servers}).encode(), relative)


def test_merge_keeps_differing_entries_unless_overwriting() -> None:
    existing = {
        "mcpServers": {"a": {"command": "x"}, "b": {"command": "old"}},
        "daemon": {"drainGrace": 5},
    }
    imported = {"a": {"command": "x"}, "b": {"command": "new"}, "c": {"command": "c"}}
    merged, outcome = merge(existing, imported, overwrite=False)
    assert outcome == [("a", "unchanged"), ("b", "kept"), ("c", "added")]
    assert merged["mcpServers"]["b"] == {"command": "old"}
    assert merged["daemon"] == {"drainGrace": 5}
    merged, outcome = merge(existing, imported, overwrite=True)
    assert ("b", "replaced") in outcome
    assert merged["mcpServers"]["b"] == {"command": "new"}
    assert existing["mcpServers"]["b"] == {"command": "old"}  # the input is not mutated


def test_jsonc_keeps_comment_markers_inside_strings() -> None:
    text = '{"url": "http://x//y", /* c */ "a": [1, 2,], // tail\n "b": "/*not*/",}'
    assert loads_jsonc(text) == {"url": "http://x//y", "a": [1, 2], "b": "/*not*/"}


# --- the command, as a user runs it ----------------------------------------------------------


def test_import_writes_the_user_config_merging_and_backing_up(tmp_path: Path) -> None:
    config = tmp_path / ".config" / "mcpool" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"mcpServers": {"time": {"command": "mine"}}, "daemon": {}}))
    done = mcpool(
        "import", "--from", "claude-code", str(SAMPLES / "claude-code" / ".mcp.json"), home=tmp_path
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert f"into {config}" in done.stdout
    assert "! time: kept your existing entry" in done.stdout
    assert "+ github: added" in done.stdout
    assert "mcpool: skipped, it is mcpool itself" in done.stdout
    written = json.loads(config.read_text())
    assert written["mcpServers"]["time"] == {"command": "mine"}
    assert set(written["mcpServers"]) == {"time", "github", "events", "files"}
    assert "daemon" in written
    assert json.loads((config.parent / "config.json.bak").read_text())["mcpServers"] == {
        "time": {"command": "mine"}
    }


def test_import_dry_run_prints_json_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = mcpool(
        "import", "--from", "gemini", str(SAMPLES / "gemini-settings.json"),
        "--output", str(out), "--dry-run", home=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["mcpServers"]) == {
        "pythonTools", "httpServer", "sseServer", "gcp", "legacy"
    }  # fmt: skip
    assert "would import from gemini" in done.stderr
    assert "gcp: authProviderType not carried over" in done.stderr
    assert not out.exists()
    assert not (tmp_path / ".config").exists()


def test_import_finds_the_clients_own_file(tmp_path: Path) -> None:
    cursor = tmp_path / ".cursor" / "mcp.json"
    cursor.parent.mkdir()
    cursor.write_text((SAMPLES / "cursor" / "mcp.json").read_text())
    done = mcpool("import", "--from", "cursor", "--dry-run", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"({cursor})" in done.stderr


def test_import_errors(tmp_path: Path) -> None:
    missing = mcpool("import", "--from", "vscode", home=tmp_path)
    assert missing.returncode == 1
    assert "no vscode configuration found" in missing.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{nope")
    done = mcpool("import", "--from", "cursor", str(broken), home=tmp_path)
    assert done.returncode == 1
    assert "is not JSON" in done.stderr
    usage = mcpool("import", "--from", "emacs", home=tmp_path)
    assert usage.returncode == 2
    assert "usage:" in usage.stderr


@pytest.mark.parametrize(
    "client", ["claude-code", "vscode", "cursor", "claude-desktop", "copilot", "opencode", "cline"]
)
def test_setup_client_output_imports_back_as_nothing(tmp_path: Path, client: str) -> None:
    # What setup-client writes is mcpool itself: importing it must not loop mcpool into mcpool.
    snippet = mcpool("setup-client", client, home=tmp_path)
    assert snippet.returncode == 0
    servers, notes = convert(client if client != "vscode" else "vscode", json.loads(snippet.stdout))
    assert servers == {}
    assert notes == ["mcpool: skipped, it is mcpool itself"]


def test_codex_config_toml() -> None:
    from mcpool.daemon._import import read_document

    path = SAMPLES / "codex" / "config.toml"
    servers, notes = convert("codex", read_document("codex", path.read_text()), path)
    assert servers == {
        "time": {
            "command": "uvx",
            "args": ["mcp-server-time"],
            "timeout": 90_000,
            "excludeTools": ["convert_time"],
        },
        "github": {
            "type": "http",
            "url": "https://api.githubcopilot.com/mcp/",
            "disabled": True,
            "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
        },
        "files": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/docs"],
            "env": {"AWS_PROFILE": "${AWS_PROFILE}"},
            "includeTools": ["read_file"],
        },
    }
    assert "files: field 'experimental_thing' not carried over (mcpool does not know it)" in notes
    assert "mcpool: skipped, it is mcpool itself" in notes


def test_qwen_settings_have_gemini_cli_shape() -> None:
    servers, _notes = _convert("qwen", "qwen/.qwen/settings.json")
    assert servers == {
        "time": {
            "command": "uvx",
            "args": ["mcp-server-time"],
            "trust": True,
            "cwd": str(SAMPLES / "qwen"),
        },
        "docs": {"httpUrl": "http://127.0.0.1:8000/mcp", "excludeTools": ["delete"]},
    }


def test_import_from_codex_reads_codex_home(tmp_path: Path) -> None:
    codex = tmp_path / ".codex"
    codex.mkdir()
    (codex / "config.toml").write_text((SAMPLES / "codex" / "config.toml").read_text())
    done = mcpool("import", "--from", "codex", home=tmp_path)
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / ".config" / "mcpool" / "config.json").read_text())
    assert sorted(written["mcpServers"]) == ["files", "github", "time"]


def test_import_backup_and_config_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    config = tmp_path / ".config" / "mcpool" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"mcpServers": {"secret": {"command": "x", "env": {"T": "s"}}}}))
    config.chmod(0o600)
    old = os.umask(0)  # the child inherits it: a umask-dependent create would make 0666
    try:
        done = mcpool(
            "import", "--from", "claude-code", str(SAMPLES / "claude-code" / ".mcp.json"),
            home=tmp_path,
        )  # fmt: skip
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    backup = config.parent / "config.json.bak"
    assert "secret" in json.loads(backup.read_text())["mcpServers"]
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    # Written atomically: no temporary file left next to it.
    assert sorted(p.name for p in config.parent.iterdir()) == ["config.json", "config.json.bak"]


def test_variables_the_daemon_expands_are_carried_over_without_a_note(tmp_path: Path) -> None:
    doc = {
        "mcpServers": {
            "api": {
                "command": "${HOME}/bin/api-server",
                "args": ["--region", "${AWS_REGION:-eu-west-1}"],
                "env": {"TOKEN": "${API_TOKEN}", "OTHER": "$BARE"},
            }
        }
    }
    servers, notes = convert("claude-desktop", doc, tmp_path / "claude_desktop_config.json")
    assert servers["api"] == doc["mcpServers"]["api"]
    # Only the form mcpool does not expand is worth a note.
    assert notes == [
        "api: env.OTHER holds a $ followed by a name (a $NAME reference, or a $ in the value "
        "itself), passed as written (mcpool expands only ${VAR} and ${VAR:-default}): check it, "
        "and put the value or ${VAR} there"
    ]


def test_the_report_never_quotes_a_value_that_may_be_a_secret(tmp_path: Path) -> None:
    """Issue 26: the report printed `$live_9Xq7SECRET` from `sk-$live_9Xq7SECRET`. A `$`
    inside a value is reported by where it is (server and field), with none of its text."""
    secrets = ["sk-$live_9Xq7SECRET", "pw${input:sEcReT1}", "x$${env:tok3nVALUE}y", "a$Zq9"]
    doc = {
        "mcpServers": {
            "api": {
                "command": "api-server",
                "args": ["--key", secrets[0]],
                "env": {"PASSWORD": secrets[1], "TOKEN": secrets[2]},
                "headers": {"Authorization": secrets[3]},
            }
        }
    }
    source = tmp_path / "mcp.json"
    source.write_text(json.dumps(doc))
    done = mcpool(
        "import", "--from", "claude-desktop", str(source),
        "--output", str(tmp_path / "out.json"), "--dry-run", home=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = done.stderr
    for where in ("api: args[1]", "api: env.PASSWORD", "api: env.TOKEN", "api: headers.Author"):
        assert where in report, report
    for part in ("live_9Xq7SECRET", "sEcReT1", "tok3nVALUE", "Zq9", "sk-"):
        assert part not in report, (part, report)


# --- Copilot CLI, opencode, Cline (issue 28) ---------------------------------------------------


def test_copilot_cli_local_servers_and_tool_lists() -> None:
    servers, notes = _convert("copilot", "copilot/mcp-config.json")
    assert servers == {
        # "local" is Copilot CLI's stdio; "tools": ["*"] is every tool, mcpool's default.
        "playwright": {"command": "npx", "args": ["@playwright/mcp@latest"], "env": {}},
        # A tool list is what Copilot CLI exposes of the server: mcpool's includeTools.
        "github": {
            "type": "http",
            "url": "https://api.githubcopilot.com/mcp/",
            "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
            "includeTools": ["get_issue", "list_pull_requests"],
        },
    }
    assert notes == ["mcpool: skipped, it is mcpool itself"]


def test_opencode_mcp_entries_with_comments() -> None:
    servers, notes = _convert("opencode", "opencode/opencode.jsonc")
    project = str(SAMPLES / "opencode")
    assert servers == {
        "files": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "./docs"],
            "env": {"API_TOKEN": "${FILES_TOKEN}"},  # opencode's {env:NAME}, mcpool's ${NAME}
            "timeout": 8000,
            "cwd": project,  # a project's file: its servers ran there
        },
        "sentry": {
            "type": "http",
            "url": "https://mcp.sentry.dev/mcp",
            "headers": {"X-Org": "acme"},
            "disabled": True,  # "enabled": false
        },
    }
    text = "\n".join(notes)
    assert 'sentry: a "remote" server: imported as streamable HTTP' in text
    assert "mcpool: skipped, it is mcpool itself" in text


def test_cline_flat_and_nested_entries() -> None:
    servers, notes = _convert("cline", "cline/cline_mcp_settings.json")
    assert servers == {
        "time": {
            "command": "uvx",
            "args": ["mcp-server-time"],
            "disabled": False,
            "timeout": 30_000,  # Cline's seconds
        },
        "docs": {"type": "sse", "url": "http://127.0.0.1:8000/sse", "disabled": True},
        "linear": {
            "type": "http",
            "url": "https://mcp.linear.app/mcp",
            "oauth": {"clientId": "linear-client"},
        },
        # Cline CLI's own shape: the transport nested.
        "memory": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-memory"],
            "env": {"MEMORY_FILE_PATH": "/home/u/memory.json"},
        },
    }
    text = "\n".join(notes)
    assert "time: autoApprove not carried over" in text
    assert "linear: Cline's OAuth state not carried over: log in with `daemonctl login`" in text
    # Cline's stored tokens are neither imported nor quoted.
    assert "secret-linear-token" not in json.dumps(servers) + text


@pytest.mark.parametrize(
    ("client", "relative", "sample"),
    [
        ("copilot", ".copilot/mcp-config.json", "copilot/mcp-config.json"),
        ("opencode", ".config/opencode/opencode.jsonc", "opencode/opencode.jsonc"),
        ("cline", ".cline/data/settings/cline_mcp_settings.json", "cline/cline_mcp_settings.json"),
    ],
)
def test_import_finds_the_new_clients_own_files(
    tmp_path: Path, client: str, relative: str, sample: str
) -> None:
    source = tmp_path / relative
    source.parent.mkdir(parents=True)
    source.write_text((SAMPLES / sample).read_text())
    done = mcpool("import", "--from", client, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"({source})" in done.stdout
    written = json.loads((tmp_path / ".config" / "mcpool" / "config.json").read_text())
    servers, _ = _convert(client, sample)
    assert sorted(written["mcpServers"]) == sorted(servers)
    assert "mcpool" not in written["mcpServers"]
