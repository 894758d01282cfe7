"""`mcpool import --from CLIENT [FILE]`: turn a client's MCP configuration into mcpool settings.

Each client spells the same idea slightly differently: Claude Code, Claude Desktop and Cursor use
`mcpServers`; VS Code uses `servers` with `type` (and `${input:...}` variables); gemini-cli uses
`mcpServers` with `httpUrl`/`url`/`trust`/`includeTools`/`excludeTools`, which is mcpool's own
shape, and so does Qwen Code (a gemini-cli fork); Codex keeps `[mcp_servers.NAME]` tables in
TOML with its own field names (`enabled_tools`, `env_vars`, `bearer_token_env_var`, ...);
Copilot CLI's `mcp-config.json` uses `mcpServers` with `"type": "local"` and a `tools` list;
opencode keeps `"mcp"` entries with the whole command line as one array, `environment` and
`enabled`; Cline's `cline_mcp_settings.json` has `mcpServers` either flat (the VS Code
extension's, with `autoApprove`) or with a nested `transport` (Cline CLI's own writer), its
timeouts in seconds and a bare `url` meaning SSE. `_from_copilot`, `_from_opencode` and
`_from_cline` bring each into Claude Code's field names first, as `_from_codex` does.
`convert` is pure: document in, (servers, notes) out. Every field or entry that cannot be
carried over as it means in the client becomes a note, so the user learns what to check instead
of finding out from a server that does not start. `main` merges the result into the user config
(or `--output`), never replacing a differing server of the same name without `--overwrite`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

CLIENTS = (
    "claude-code", "claude-desktop", "vscode", "cursor", "gemini", "qwen", "codex",
    "copilot", "opencode", "cline",
)  # fmt: skip
# Clients whose settings.json has gemini-cli's shape.
_GEMINI_LIKE = ("gemini", "qwen")

# Fields every client shares with mcpool, carried over as they are.
_COMMON = ("command", "args", "env", "cwd", "url", "headers", "description", "disabled")
# gemini-cli's fields are mcpool's policy fields verbatim.
_GEMINI = ("httpUrl", "timeout", "trust", "includeTools", "excludeTools")
_MCPOOL = ("alwaysLoadTools", "scope", "prefix", "roots")
_TYPES = {"stdio": "stdio", "http": "http", "sse": "sse"}
_TYPE_ALIASES = {"streamable-http": "http", "streamableHttp": "http", "streamable_http": "http"}

_VAR = re.compile(r"\$\{(?P<name>[^}]+)\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")
# What the daemon expands (daemon/_expand.py REFERENCE): carried over as written.
_EXPANDED = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?\}")


class ImportFailed(Exception):
    """Printed as `mcpool import: <message>`; exit status 1."""


def default_sources(client: str) -> list[Path]:
    """Where each client keeps its configuration, project file first."""
    home, cwd = Path.home(), Path.cwd()
    config = os.environ.get("XDG_CONFIG_HOME", "")
    xdg = Path(config) if os.path.isabs(config) else home / ".config"
    if client == "claude-code":
        return [cwd / ".mcp.json", home / ".claude.json"]
    if client == "claude-desktop":
        if sys.platform == "darwin":
            mac = home / "Library" / "Application Support" / "Claude"
            return [mac / "claude_desktop_config.json"]
        return [xdg / "Claude" / "claude_desktop_config.json"]
    if client == "vscode":
        return [cwd / ".vscode" / "mcp.json", xdg / "Code" / "User" / "mcp.json"]
    if client == "cursor":
        return [cwd / ".cursor" / "mcp.json", home / ".cursor" / "mcp.json"]
    if client == "codex":
        codex_home = os.environ.get("CODEX_HOME", "")
        base = Path(codex_home) if os.path.isabs(codex_home) else home / ".codex"
        return [base / "config.toml"]
    if client in ("copilot", "opencode", "cline"):
        from mcpool.daemon._setup import cline_file, copilot_file, opencode_file

        if client == "copilot":
            return [copilot_file()]
        if client == "cline":
            # Cline CLI's own file, then the VS Code extension's (Cline's first home).
            extension = xdg / "Code" / "User" / "globalStorage" / "saoudrizwan.claude-dev"
            return [cline_file(), extension / "settings" / "cline_mcp_settings.json"]
        found = [opencode_file("project"), opencode_file("user")]
        return list(dict.fromkeys(found))
    folder = f".{client}"  # gemini, qwen
    return [cwd / folder / "settings.json", home / folder / "settings.json"]


def read_document(client: str, text: str) -> Any:
    """The client file's document: TOML for Codex, JSON with comments for the others."""
    if client == "codex":
        import tomllib

        return tomllib.loads(text)
    return loads_jsonc(text)


def loads_jsonc(text: str) -> Any:
    """JSON with `//` and `/* */` comments and trailing commas (VS Code's and gemini's files)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return json.loads(re.sub(r",(\s*[}\]])", r"\1", "".join(out)))


def is_mcpool(entry: dict[str, Any]) -> bool:
    """The entry `mcpool setup-client` writes: importing it would make mcpool start itself."""
    command = os.path.basename(str(entry.get("command") or ""))
    args = [str(a) for a in entry.get("args") or []]
    return (command == "mcpool" and args[:1] == ["attach"]) or args[:3] == [
        "-m",
        "mcpool",
        "attach",
    ]


def _project_dir(client: str, source: Path | None) -> Path | None:
    """The project a project-scoped file belongs to (its servers ran there), else None."""
    if source is None:
        return None
    if client == "claude-code" and source.name == ".mcp.json":
        return source.parent
    if client == "opencode":
        from mcpool.daemon._setup import opencode_file

        user_folder = opencode_file("user").parent
        return None if source.parent in (user_folder, Path.home()) else source.parent
    # ~/.cursor/mcp.json and ~/.gemini/settings.json are user files, not a project's.
    in_project = source.parent.name in (".vscode", ".cursor", ".gemini", ".qwen")
    if (
        client in ("vscode", "cursor", "gemini", "qwen")
        and in_project
        and source.parent.parent != Path.home()
    ):
        return source.parent.parent
    return None


def _servers_of(client: str, document: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    if client == "vscode":
        servers = document.get("servers")
        if servers is None and isinstance(document.get("mcp"), dict):
            servers = document["mcp"].get("servers")  # the user settings.json form
        if isinstance(document.get("inputs"), list) and document["inputs"]:
            ids = [str(i.get("id")) for i in document["inputs"] if isinstance(i, dict)]
            notes.append(
                f"VS Code input prompts ({', '.join(ids)}) are not carried over: mcpool has no "
                "way to ask; put the values in the imported entries by hand"
            )
    elif client == "codex":
        servers = document.get("mcp_servers")
    elif client == "opencode":
        servers = document.get("mcp")
    else:
        servers = document.get("mcpServers")
    if client == "claude-code" and isinstance(document.get("projects"), dict):
        for project, config in document["projects"].items():
            local = config.get("mcpServers") if isinstance(config, dict) else None
            if local:
                notes.append(
                    f"project-scoped servers of {project} ({', '.join(sorted(local))}) are not "
                    "imported: they belong to that project; add them to its .mcp.json, which "
                    "`mcpool attach` reads when started there"
                )
    if servers is None:
        return {}
    if not isinstance(servers, dict):
        raise ImportFailed("its MCP servers are not a JSON object")
    return servers


def convert(
    client: str, document: Any, source: Path | None = None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(mcpool server entries by name, notes on what was not carried over as it was)."""
    if client not in CLIENTS:
        raise ValueError(client)
    if not isinstance(document, dict):
        raise ImportFailed("the file does not hold a JSON object")
    notes: list[str] = []
    servers = _servers_of(client, document, notes)
    gemini_mcp = document.get("mcp") if client in _GEMINI_LIKE else None
    allowed = excluded = None
    if isinstance(gemini_mcp, dict):
        allowed = gemini_mcp.get("allowed")
        excluded = gemini_mcp.get("excluded")
    project = _project_dir(client, source)
    out: dict[str, dict[str, Any]] = {}
    for name, raw in servers.items():
        if not isinstance(raw, dict):
            notes.append(f"{name}: skipped, its entry is not an object")
            continue
        translate = _TRANSLATORS.get(client)
        client_notes: list[str] = []
        if translate is not None:
            raw, client_notes = translate(raw)
        if is_mcpool(raw):
            notes.append(f"{name}: skipped, it is mcpool itself")
            continue
        notes.extend(f"{name}: {note}" for note in client_notes)
        entry, entry_notes = _convert_entry(client, name, raw, project)
        notes.extend(f"{name}: {note}" for note in entry_notes)
        if entry is None:
            continue
        if (isinstance(allowed, list) and name not in allowed) or (
            isinstance(excluded, list) and name in excluded
        ):
            entry["disabled"] = True
            notes.append(f"{name}: imported disabled, as gemini's mcp.allowed/excluded had it")
        out[name] = entry
    return out, notes


def _convert_entry(
    client: str, name: str, raw: dict[str, Any], project: Path | None
) -> tuple[dict[str, Any] | None, list[str]]:
    notes: list[str] = []
    entry: dict[str, Any] = {}
    carried = set(_COMMON) | set(_MCPOOL) | {"type"}
    carried |= set(_GEMINI) if client in _GEMINI_LIKE else {"trust", "includeTools", "excludeTools"}
    if client in _TRANSLATORS:
        carried.add("timeout")  # made from the client's own timeouts by its translator
    for key in raw:
        if key in carried:
            entry[key] = raw[key]
        elif key == "envFile":
            notes.append(f"envFile {raw[key]!r} not carried over: copy its variables into env")
        elif key == "oauth" and isinstance(raw[key], dict):
            # mcpool reads the same object (pool/_oauth.py OAuthSettings); what it discovers
            # itself (authorizationUrl, tokenUrl, ...) is left out, and said so.
            known = ("enabled", "clientId", "clientSecret", "scopes", "callbackPort")
            entry["oauth"] = {k: v for k, v in raw[key].items() if k in known}
            dropped = sorted(k for k in raw[key] if k not in known)
            if dropped:
                notes.append(
                    f"oauth fields {', '.join(dropped)} not carried over: mcpool discovers "
                    "them from the server (`daemonctl login NAME` logs in)"
                )
        elif key in ("authProviderType", "targetAudience", "targetServiceAccount"):
            notes.append(f"{key} not carried over: mcpool supports the OAuth login flow only")
        elif key == "dev":
            notes.append("VS Code's dev (watch/debug) settings ignored")
        elif key == "gallery" or key == "version":
            continue  # VS Code's provenance metadata
        else:
            notes.append(f"field {key!r} not carried over (mcpool does not know it)")
    kind = entry.pop("type", None)
    if kind is not None:
        kind = _TYPE_ALIASES.get(str(kind), str(kind))
        if kind not in _TYPES:
            return None, [*notes, f"skipped, transport type {kind!r} is not supported"]
        entry = {"type": kind, **entry}
    elif "url" in entry and client not in _GEMINI_LIKE:
        # Only gemini reads a bare url as SSE (mcpool's rule); the others mean streamable HTTP
        # or let the client probe, so say it explicitly.
        entry = {"type": "http", **entry}
        notes.append(
            'url without "type": imported as streamable HTTP; set "type": "sse" if the '
            "server only speaks SSE"
        )
    if entry.get("type") == "stdio" and client != "vscode":
        entry.pop("type")  # a command already means stdio; keep the entry as the user wrote it
    stdio = bool(entry.get("command"))
    cwd = entry.get("cwd")
    if project is not None and stdio and cwd is None:
        entry["cwd"] = str(project)
        notes.append(f"runs in {project} (the project its file belongs to)")
    elif isinstance(cwd, str) and not os.path.isabs(os.path.expanduser(cwd)):
        if project is not None:
            entry["cwd"] = str(project / cwd)
        else:
            notes.append(
                f"cwd {cwd!r} is relative: mcpool resolves it against the folder of the settings "
                "file holding it (your home folder for the user config); make it absolute"
            )
    notes.extend(_variable_notes(client, entry, project))
    if project is not None and client == "vscode":
        entry = _substitute(entry, "${workspaceFolder}", str(project))
    try:
        from mcpool.daemon._settings import parse_server_entry
        from mcpool.protocol import SettingsError

        parse_server_entry(name, entry)
    except SettingsError as exc:
        return None, [*notes, f"skipped, not a valid server entry: {exc.reason}"]
    return entry, notes


# Codex's field -> mcpool's, for those that mean the same.
_CODEX_SAME = {
    "command": "command",
    "args": "args",
    "env": "env",
    "cwd": "cwd",
    "url": "url",
    "http_headers": "headers",
    "enabled_tools": "includeTools",
    "disabled_tools": "excludeTools",
}


def _from_codex(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A Codex `[mcp_servers.NAME]` table in mcpool's (Claude Code's) field names."""
    entry: dict[str, Any] = {}
    notes: list[str] = []
    headers: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _CODEX_SAME:
            if key == "http_headers" and isinstance(value, dict):
                headers.update(value)
            else:
                entry[_CODEX_SAME[key]] = value
        elif key == "enabled":
            if value is False:
                entry["disabled"] = True
        elif key == "env_vars" and isinstance(value, list):
            # Codex passes these through from its own environment; mcpool expands ${VAR} from
            # the attaching session's environment, which is the same thing.
            env = dict(entry.get("env") or {})
            env.update({str(v): f"${{{v}}}" for v in value})
            entry["env"] = env
        elif key == "bearer_token_env_var" and isinstance(value, str):
            headers["Authorization"] = f"Bearer ${{{value}}}"
        elif key == "env_http_headers" and isinstance(value, dict):
            headers.update({str(h): f"${{{v}}}" for h, v in value.items()})
        elif key in ("tool_timeout_sec", "startup_timeout_sec", "startup_timeout_ms"):
            ms = value if key.endswith("_ms") else value * 1000
            if isinstance(ms, int | float) and ms > entry.get("timeout", 0):
                entry["timeout"] = int(ms)  # mcpool's one timeout bounds start-up and calls
        else:
            notes.append(f"field {key!r} not carried over (mcpool does not know it)")
    if headers:
        entry["headers"] = headers
    if "url" in entry:
        entry = {"type": "http", **entry}  # Codex speaks streamable HTTP to a url
    return entry, notes


def _from_copilot(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A Copilot CLI `mcp-config.json` entry in Claude Code's field names."""
    entry: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in raw.items():
        if key == "type":
            # "local" is its word for stdio; "http" and "sse" are mcpool's own.
            entry["type"] = "stdio" if value == "local" else value
        elif key == "tools":
            if isinstance(value, list) and "*" not in value:
                entry["includeTools"] = value  # Copilot CLI exposes only the tools listed
        elif key == "timeout":
            entry["timeout"] = value  # milliseconds, as mcpool's
        else:
            entry[key] = value
    return entry, notes


# opencode's `{env:NAME}` is the value of NAME in its own environment; mcpool's `${NAME}` is the
# same, from the attaching session's environment.
_OPENCODE_ENV = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _opencode_value(value: Any) -> Any:
    if isinstance(value, str):
        return _OPENCODE_ENV.sub(r"${\1}", value)
    if isinstance(value, list):
        return [_opencode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _opencode_value(v) for k, v in value.items()}
    return value


def _from_opencode(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """An opencode `"mcp"` entry in Claude Code's field names."""
    entry: dict[str, Any] = {}
    notes: list[str] = []
    raw = _opencode_value(raw)
    for key, value in raw.items():
        if key == "type":
            if value == "remote":
                # opencode tries streamable HTTP and falls back to SSE; mcpool needs one.
                entry["type"] = "http"
                notes.append(
                    'a "remote" server: imported as streamable HTTP; set "type": "sse" if the '
                    "server only speaks SSE"
                )
            elif value != "local":
                entry["type"] = value
        elif key == "command" and isinstance(value, list) and value:
            entry["command"], entry["args"] = value[0], value[1:]
        elif key == "environment":
            entry["env"] = value
        elif key == "enabled":
            if value is False:
                entry["disabled"] = True
        elif key == "oauth" and value is False:
            continue  # OAuth switched off: mcpool logs in only when asked (`daemonctl login`)
        else:
            entry[key] = value
    if any("{file:" in text for _, text in _strings(entry, "")):
        notes.append("holds {file:...} references, passed as written: put the value there")
    return entry, notes


def _from_cline(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A Cline `cline_mcp_settings.json` entry (flat or with a nested `transport`) in Claude
    Code's field names."""
    entry: dict[str, Any] = {}
    notes: list[str] = []
    flat = dict(raw)
    transport = flat.pop("transport", None)
    if isinstance(transport, dict):
        flat = {**transport, **flat}
    kind = flat.pop("type", None) or flat.pop("transportType", None)
    for key, value in flat.items():
        if key == "timeout" and isinstance(value, int | float):
            entry["timeout"] = int(value * 1000)  # Cline's are seconds
        elif key in ("autoApprove", "alwaysAllow"):
            notes.append(
                f"{key} not carried over: mcpool does not ask before calls (your client does)"
            )
        elif key == "oauth":
            # Cline's own tokens and client registration: mcpool makes its own.
            notes.append("Cline's OAuth state not carried over: log in with `daemonctl login`")
        elif key == "oauthClient" and isinstance(value, dict):
            entry["oauth"] = {k: value[k] for k in ("clientId", "clientSecret") if k in value}
        elif key == "metadata":
            continue
        else:
            entry[key] = value
    if kind in ("streamableHttp", "http"):
        entry = {"type": "http", **entry}
    elif kind == "sse" or (kind is None and "url" in entry):
        entry = {"type": "sse", **entry}  # Cline reads a bare url as SSE
    elif kind is not None and kind != "stdio":
        entry = {"type": kind, **entry}
    return entry, notes


_TRANSLATORS = {
    "codex": _from_codex,
    "copilot": _from_copilot,
    "opencode": _from_opencode,
    "cline": _from_cline,
}


def _strings(value: Any, where: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in _strings(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, f"{where}.{k}")]
    return []


def _variable_notes(client: str, entry: dict[str, Any], project: Path | None) -> list[str]:
    """One note per field holding a `$` reference mcpool does not expand. A note says where
    it is and what kind of reference it is, never any of the text: a `$` inside a value may be
    part of a secret (`sk-$live_...` is a key, not a reference), and the report is printed."""
    notes = []
    for where, text in _strings(entry, ""):
        kinds: list[str] = []
        for m in _VAR.finditer(text):
            var = m.group(0)
            if var == "${workspaceFolder}" and client == "vscode" and project is not None:
                continue
            if _EXPANDED.fullmatch(var):
                continue  # mcpool expands it from the session's environment, as the client did
            kind = _reference_kind(m)
            if kind not in kinds:
                kinds.append(kind)
        if kinds:
            notes.append(
                f"{where.lstrip('.')} holds {' and '.join(kinds)}, passed as written (mcpool "
                "expands only ${VAR} and ${VAR:-default}): check it, and put the value or "
                "${VAR} there"
            )
    return notes


def _reference_kind(m: re.Match[str]) -> str:
    """What kind of `$` reference `m` is, in words that quote none of it."""
    name = m.group("name")
    if name is None:
        return "a $ followed by a name (a $NAME reference, or a $ in the value itself)"
    if name.startswith("input:"):
        return "a VS Code ${input:...} variable"
    if name.startswith("env:"):
        return "an ${env:...} variable"
    return "a ${...} variable"


def _substitute(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_substitute(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, old, new) for k, v in value.items()}
    return value


def merge(
    existing: dict[str, Any], imported: dict[str, dict[str, Any]], overwrite: bool
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The merged document and, per imported server, what happened: added, unchanged, replaced
    or kept (a differing server of that name already there and no --overwrite)."""
    document = dict(existing)
    servers = dict(document.get("mcpServers") or {})
    outcome = []
    for name, entry in imported.items():
        if name not in servers:
            servers[name] = entry
            outcome.append((name, "added"))
        elif servers[name] == entry:
            outcome.append((name, "unchanged"))
        elif overwrite:
            servers[name] = entry
            outcome.append((name, "replaced"))
        else:
            outcome.append((name, "kept"))
    document["mcpServers"] = servers
    return document, outcome


_MARKS = {"added": "+", "unchanged": "=", "replaced": "~", "kept": "!"}
_WHAT = {
    "added": "added",
    "unchanged": "already there, unchanged",
    "replaced": "replaced the existing entry",
    "kept": "kept your existing entry, which differs (--overwrite replaces it)",
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mcpool import",
        description="Import a client's MCP servers into mcpool settings.",
    )
    parser.add_argument("--from", dest="client", choices=CLIENTS, required=True)
    parser.add_argument("file", nargs="?", metavar="FILE", help="default: the client's own file")
    parser.add_argument("--output", metavar="FILE", help="default: the mcpool user config")
    parser.add_argument("--dry-run", action="store_true", help="print the result, write nothing")
    parser.add_argument("--overwrite", action="store_true", help="replace same-named servers")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return _run(args)
    except ImportFailed as exc:
        sys.stderr.write(f"mcpool import: {exc}\n")
        return 1


def _run(args: argparse.Namespace) -> int:
    from mcpool.daemon._files import backup_private
    from mcpool.daemon._paths import config_path
    from mcpool.daemon._setup import atomic_write_json

    if args.file:
        source = Path(args.file).expanduser().absolute()
    else:
        candidates = default_sources(args.client)
        found = [p for p in candidates if p.exists()]
        if not found:
            tried = ", ".join(str(p) for p in candidates)
            raise ImportFailed(f"no {args.client} configuration found (looked at {tried})")
        source = found[0]
    try:
        document = read_document(args.client, source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ImportFailed(f"cannot read {source}: {exc.strerror or exc}") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError included
        kind = "TOML" if args.client == "codex" else "JSON"
        raise ImportFailed(f"{source} is not {kind}: {exc}") from None
    try:
        imported, notes = convert(args.client, document, source)
    except ImportFailed as exc:
        raise ImportFailed(f"{source}: {exc}") from None
    target = Path(args.output).expanduser().absolute() if args.output else config_path(None)
    existing: dict[str, Any] = {}
    if target.exists() and target.read_text(encoding="utf-8").strip():
        try:
            loaded = json.loads(target.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ImportFailed(f"{target} is not JSON ({exc}); fix it first") from None
        if not isinstance(loaded, dict):
            raise ImportFailed(f"{target} does not hold a JSON object")
        existing = loaded
    document_out, outcome = merge(existing, imported, args.overwrite)
    report = sys.stderr if args.dry_run else sys.stdout
    if args.dry_run:
        sys.stdout.write(json.dumps(document_out, indent=2) + "\n")
    verb = "would import" if args.dry_run else "imported"
    report.write(f"{verb} from {args.client} ({source}) into {target}:\n")
    if not outcome:
        report.write("  (no servers)\n")
    for name, what in outcome:
        report.write(f"  {_MARKS[what]} {name}: {_WHAT[what]}\n")
    if notes:
        report.write("not carried over as it was:\n")
        for note in notes:
            report.write(f"  - {note}\n")
    if not imported:
        raise ImportFailed(f"no MCP servers to import from {source}")
    if not args.dry_run and any(what in ("added", "replaced") for _, what in outcome):
        if target.exists():
            backup = target.with_name(target.name + ".bak")
            # As secret as the config it copies: 0600 from the start (daemon/_files.py).
            backup_private(target, backup)
            report.write(f"previous version kept as {backup}\n")
        atomic_write_json(target, document_out)
    return 0
