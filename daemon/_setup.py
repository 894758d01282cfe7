"""`mcpool setup-client` and `mcpool systemd-unit`: pointing clients and systemd at mcpool.

`setup-client CLIENT` prints the snippet that makes CLIENT launch `mcpool attach` as one stdio MCP
server. `--write` merges it into the client's own file: a JSON file is read as JSON (a file with
comments is refused rather than silently losing them), Codex's `config.toml` is edited with
tomlkit (its comments and layout stay), the previous version is kept next to it as
`<file>.bak-<timestamp>` and the new one replaces it atomically; both are 0600 (a client's config
holds its servers' tokens): daemon/_files.py. A JSON file that changed between the read and the
write (a running client saving its own state, as Claude Code does in ~/.claude.json) is left as
the client wrote it and the write refused, rather than one of the two edits lost.

Each client's entry is in its own shape (`entry_for`): `{"command", "args"}` under `mcpServers`
for most; VS Code's `servers` with `"type": "stdio"`; Copilot CLI's `"type": "local"` with
`"tools": ["*"]` (it exposes none of a server's tools without a list); opencode's `"mcp"` with
`"type": "local"` and the whole command line as one array; Cline CLI's `cline_mcp_settings.json`
in the shape its own `cline mcp add` writes (`"transport": {"type": "stdio", ...}`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ._files import backup_private, write_private

CLIENTS = (
    "claude-code", "vscode", "cursor", "claude-desktop", "codex", "gemini", "qwen",
    "copilot", "opencode", "cline",
)  # fmt: skip
SERVER_NAME = "mcpool"
# Claude Code, VS Code, gemini-cli, Qwen Code and opencode keep servers per user and per project;
# `--scope` chooses (default_scope). Why the others have no project scope `--write` could edit.
NO_PROJECT_SCOPE = {
    "copilot": "Copilot CLI reads MCP servers from ~/.copilot/mcp-config.json only",
    "cline": "Cline CLI reads MCP servers from its cline_mcp_settings.json only",
    "codex": "Codex reads MCP servers from $CODEX_HOME/config.toml only",
    "cursor": "use --file .cursor/mcp.json for a project's Cursor file",
    "claude-desktop": "Claude Desktop has one config file",
}


def default_scope(client: str) -> str:
    """The user file, but the project's for Claude Code and VS Code (their `--write` has always
    meant the project's .mcp.json and .vscode/mcp.json)."""
    return "project" if client in ("claude-code", "vscode") else "user"


def _xdg_config() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME", "")
    return Path(config) if os.path.isabs(config) else Path.home() / ".config"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value) if os.path.isabs(value) else None


def claude_user_file() -> Path:
    """Claude Code's user-scope file: ~/.claude.json ($CLAUDE_CONFIG_DIR/.claude.json)."""
    return (_env_path("CLAUDE_CONFIG_DIR") or Path.home()) / ".claude.json"


def copilot_file() -> Path:
    return (_env_path("COPILOT_HOME") or Path.home() / ".copilot") / "mcp-config.json"


def cline_file() -> Path:
    """Where Cline CLI reads MCP servers (its @cline/shared storage paths, in their order)."""
    explicit = _env_path("CLINE_MCP_SETTINGS_PATH")
    if explicit is not None:
        return explicit
    base = _env_path("CLINE_DIR") or Path.home() / ".cline"
    data = _env_path("CLINE_DATA_DIR") or base / "data"
    return data / "settings" / "cline_mcp_settings.json"


def opencode_file(scope: str) -> Path:
    """opencode's config: $OPENCODE_CONFIG, else opencode.json (or an existing opencode.jsonc)
    in the project or in ~/.config/opencode."""
    explicit = _env_path("OPENCODE_CONFIG")
    if explicit is not None:
        return explicit
    folder = Path.cwd() if scope == "project" else _xdg_config() / "opencode"
    plain, commented = folder / "opencode.json", folder / "opencode.jsonc"
    return commented if commented.exists() and not plain.exists() else plain


def mcpool_command() -> list[str]:
    """How a client should launch mcpool: the installed script's absolute path when there is
    one (clients do not share the shell's PATH), else this interpreter with `-m mcpool`."""
    script = Path(sys.executable).with_name("mcpool")
    if script.exists():
        return [str(script)]
    found = shutil.which("mcpool")
    if found:
        return [os.path.abspath(found)]
    return [sys.executable, "-m", "mcpool"]


def client_file(client: str, scope: str | None = None) -> Path:
    """The file `--write` edits by default for each client."""
    home = Path.home()
    scope = scope or default_scope(client)
    if client == "copilot":
        return copilot_file()
    if client == "cline":
        return cline_file()
    if client == "opencode":
        return opencode_file(scope)
    if client == "codex":
        codex_home = os.environ.get("CODEX_HOME", "")
        return (Path(codex_home) if os.path.isabs(codex_home) else home / ".codex") / "config.toml"
    if client in ("gemini", "qwen"):
        base = Path.cwd() if scope == "project" else home
        return base / f".{client}" / "settings.json"
    if client == "claude-code":
        if scope == "user":
            return claude_user_file()
        return Path.cwd() / ".mcp.json"  # project scope: the file Claude Code shares with a team
    if client == "vscode":
        if scope == "user":
            return _xdg_config() / "Code" / "User" / "mcp.json"
        return Path.cwd() / ".vscode" / "mcp.json"
    if client == "cursor":
        return home / ".cursor" / "mcp.json"
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"
    return _xdg_config() / "Claude" / "claude_desktop_config.json"


def attach_socket(explicit: str | None = None) -> Path | None:
    """The `--socket` the client's entry must name: None when a bridge the client launches finds
    this user's daemon by itself. Clients drop most variables (MCPOOL_SOCKET, XDG_RUNTIME_DIR)
    from a server's environment, so what counts is the path found without them."""
    from mcpool.daemon._paths import client_socket_path, socket_path

    wanted = socket_path(explicit)
    return wanted if explicit or wanted != client_socket_path() else None


def attach_args(socket: Path | None = None) -> list[str]:
    """The arguments after the mcpool command: `attach`, and `--socket` when it must be named."""
    return ["attach", "--socket", str(socket)] if socket else ["attach"]


def server_entry(client: str, command: list[str], socket: Path | None = None) -> dict[str, Any]:
    return entry_for(client, [*command, *attach_args(socket)])


def entry_for(client: str, argv: list[str]) -> dict[str, Any]:
    """The client's entry for a stdio server run as `argv`, in that client's own shape."""
    if client == "opencode":
        return {"type": "local", "command": list(argv), "enabled": True}
    entry: dict[str, Any] = {"command": argv[0], "args": list(argv[1:])}
    if client == "vscode":
        return {"type": "stdio", **entry}
    if client == "copilot":
        return {"type": "local", **entry, "tools": ["*"]}
    if client == "cline":
        return {"transport": {"type": "stdio", **entry}}
    return entry


def servers_key(client: str) -> str:
    return {"vscode": "servers", "opencode": "mcp"}.get(client, "mcpServers")


def snippet(client: str, command: list[str], socket: Path | None = None) -> dict[str, Any]:
    return {servers_key(client): {SERVER_NAME: server_entry(client, command, socket)}}


def write_client_file(
    path: Path, client: str, command: list[str], socket: Path | None = None
) -> tuple[Path | None, list[str]]:
    """Merge the mcpool entry into `path`. Returns (backup path or None, other server names)."""
    document: dict[str, Any] = {}
    backup: Path | None = None
    before: bytes | None = None
    if path.exists():
        before = path.read_bytes()
        try:
            text = before.decode("utf-8")
        except UnicodeDecodeError:
            raise SetupError(f"{path} is not UTF-8 text; fix it first") from None
        if text.strip():
            try:
                loaded = json.loads(text)
            except ValueError as exc:
                raise SetupError(
                    f"{path} is not plain JSON ({exc}); comments or trailing commas would be "
                    "lost, so add the snippet by hand"
                ) from None
            if not isinstance(loaded, dict):
                raise SetupError(f"{path} does not hold a JSON object")
            document = loaded
        backup = keep_backup(path)
    key = servers_key(client)
    servers = document.get(key)
    if servers is None:
        servers = document[key] = {}
    if not isinstance(servers, dict):
        raise SetupError(f"{path}: {key!r} is not an object")
    servers[SERVER_NAME] = server_entry(client, command, socket)
    # The last moment before the replace: a client saving the file since our read would lose its
    # save to ours (or we ours to its next one). Refuse instead; a second try usually succeeds.
    now = path.read_bytes() if path.exists() else None
    if now != before:
        raise SetupError(
            f"{path} changed while mcpool was editing it (the client saving its own state?); "
            "nothing written: run the command again, or quit the client first"
        )
    atomic_write_json(path, document)
    return backup, sorted(name for name in servers if name != SERVER_NAME)


def keep_backup(path: Path) -> Path:
    """Copy `path` to `<name>.bak-<timestamp>` (0600: a backup of a secret is a secret)."""
    backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
    backup_private(path, backup)
    return backup


def write_codex_file(
    path: Path, command: list[str], socket: Path | None = None
) -> tuple[Path | None, list[str]]:
    """Add `[mcp_servers.mcpool]` to Codex's config.toml, keeping its comments and layout."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    backup: Path | None = None
    text = ""
    if path.exists():
        text = path.read_text(encoding="utf-8")
        backup = keep_backup(path)
    try:
        document = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise SetupError(f"{path} is not valid TOML ({exc}); fix it first") from None
    servers = document.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        document["mcp_servers"] = servers
    if not isinstance(servers, dict):
        raise SetupError(f"{path}: 'mcp_servers' is not a table")
    entry = tomlkit.table()
    entry["command"] = command[0]
    entry["args"] = [*command[1:], *attach_args(socket)]
    servers[SERVER_NAME] = entry
    write_private(path, tomlkit.dumps(document).encode("utf-8"))
    return backup, sorted(name for name in servers if name != SERVER_NAME)


def atomic_write_json(path: Path, document: Any) -> None:
    """Replace `path` with `document` as JSON: 0600, atomically (daemon/_files.py)."""
    write_private(path, (json.dumps(document, indent=2) + "\n").encode("utf-8"))


class SetupError(Exception):
    """Printed as `mcpool <command>: <message>`; exit status 1."""


def setup_client_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mcpool setup-client",
        description="Print (or write) the settings that point an MCP client at `mcpool attach`.",
    )
    parser.add_argument("client", choices=CLIENTS)
    parser.add_argument("--write", action="store_true", help="edit the client's file (backed up)")
    parser.add_argument("--file", metavar="PATH", help="the client file to edit with --write")
    parser.add_argument(
        "--scope",
        choices=("user", "project"),
        help="claude-code (~/.claude.json or ./.mcp.json) and vscode: the user file or this "
        "folder's (the default); gemini, qwen and opencode: the user file (the default) or "
        "this folder's",
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's socket (default: named in the entry only when a client-launched "
        "bridge would not find it by itself)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    refused = _scope_refusal(args.client, args.scope)
    if refused is not None and not args.file:
        sys.stderr.write(f"mcpool setup-client: --scope {args.scope}: {refused}\n")
        return 1
    command = mcpool_command()
    default_file = client_file(args.client, args.scope)
    socket = attach_socket(args.socket)
    if socket is not None:
        sys.stderr.write(
            f"the entry names --socket {socket}: a bridge would not find it without "
            "MCPOOL_SOCKET or XDG_RUNTIME_DIR, which clients drop from its environment\n"
        )
    if not args.write:
        if args.client == "codex":
            sys.stdout.write(codex_snippet(command, socket))
        else:
            sys.stdout.write(json.dumps(snippet(args.client, command, socket), indent=2) + "\n")
        # Hints on stderr: stdout stays the snippet alone, ready to paste or pipe.
        if args.client == "claude-code":
            shell = " ".join([*command, *attach_args(socket)])
            sys.stderr.write(f"or: claude mcp add {SERVER_NAME} -s user -- {shell}\n")
        if args.client == "cline":
            shell = " ".join([*command, *attach_args(socket)])
            sys.stderr.write(f"or: cline mcp add {SERVER_NAME} --yes -- {shell}\n")
        sys.stderr.write(f"`--write` adds it to {default_file}\n")
        return 0
    path = Path(args.file).expanduser().absolute() if args.file else default_file
    try:
        if args.client == "codex":
            backup, others = write_codex_file(path, command, socket)
        else:
            backup, others = write_client_file(path, args.client, command, socket)
    except (SetupError, OSError) as exc:
        sys.stderr.write(f"mcpool setup-client: {exc}\n")
        return 1
    kept = f" (previous version kept as {backup})" if backup else ""
    sys.stdout.write(f"{args.client} now launches mcpool: wrote {path}{kept}\n")
    for line in _project_notes(args.client, path):
        sys.stdout.write(f"note: {line}\n")
    if others:
        sys.stdout.write(
            f"note: {path} still starts its own servers ({', '.join(others)}); import them with "
            f"`mcpool import --from {args.client} {path}` and remove them here so they are "
            "shared\n"
        )
    return 0


def _scope_refusal(client: str, scope: str | None) -> str | None:
    """Why `--scope` cannot be honoured for `client` (None: it can, or none was asked)."""
    return NO_PROJECT_SCOPE.get(client) if scope == "project" else None


def codex_snippet(command: list[str], socket: Path | None = None) -> str:
    import tomlkit

    entry = tomlkit.table()
    entry["command"] = command[0]
    entry["args"] = [*command[1:], *attach_args(socket)]
    servers = tomlkit.table(is_super_table=True)
    servers[SERVER_NAME] = entry
    document = tomlkit.document()
    document["mcp_servers"] = servers
    return tomlkit.dumps(document)


def _project_notes(client: str, path: Path) -> list[str]:
    """What a project-scoped entry means: the client may still ask, and mcpool does not loop."""
    if client == "claude-code" and path.name == ".claude.json":
        return [
            "user scope: Claude Code offers mcpool in every folder without asking; sessions "
            "already running see it when they start again"
        ]
    if client != "claude-code" or path.name != ".mcp.json":
        return []
    return [
        "Claude Code asks once per project whether to use the servers of its .mcp.json: "
        "approve 'mcpool' when it starts here (or add it for your user instead, which asks "
        "nothing: `mcpool setup-client claude-code --write --scope user`)",
        f"mcpool attach reads {path} for this project's servers and skips the entry that "
        "launches mcpool itself, so mcpool never becomes its own upstream",
    ]


UNIT = """\
# mcpool: one daemon per user sharing MCP servers between editor sessions.
# Install: mcpool systemd-unit > ~/.config/systemd/user/mcpool.service
#          systemctl --user daemon-reload && systemctl --user enable --now mcpool
[Unit]
Description=mcpool MCP server pool

[Service]
Type=simple
ExecStart={exec_start} daemon
# SIGHUP re-reads the settings files.
ExecReload=/bin/kill -HUP $MAINPID
# The daemon closes its upstream servers itself (stdin, SIGTERM, SIGKILL per process group);
# "mixed" lets it, and kills whatever is left only after TimeoutStopSec.
KillMode=mixed
TimeoutStopSec=30
# The daemon exits 0 only when asked to stop; a crash exits 1 (its traceback in the journal and
# in the daemon log), and on-failure brings it back.
Restart=on-failure
RestartSec=2

[Install]
WantedBy=default.target
"""


def systemd_unit_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mcpool systemd-unit",
        description="Print a systemd user unit that runs `mcpool daemon`.",
    )
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    exec_start = " ".join(_systemd_quote(part) for part in mcpool_command())
    sys.stdout.write(UNIT.format(exec_start=exec_start))
    return 0


def _systemd_quote(word: str) -> str:
    if word and all(c.isalnum() or c in "/._-+:@" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
