"""`mcpool`: the console script, dispatching to the daemon or the attach bridge.

Every MCP client launches `mcpool attach` for every session, so this module stays stdlib-only
and tiny, and each subcommand is imported only when chosen (no argparse: the bridge's start-up
is user-visible latency, about 20-30 ms of budget, mostly the interpreter's own).
"""

import sys

USAGE = """\
usage: mcpool COMMAND [ARGS...]

commands:
  attach [--socket PATH] [--settings FILE]... [--name NAME] [--max-name-length N]
         [--tool-search on|off]
              a stdio MCP server relaying to the mcpool daemon (starting it when needed)
  daemon ...  run the daemon in the foreground (`mcpool daemon --help`)
  demo        see mcpool share one server between three sessions (private, cleans up)
  import --from CLIENT [FILE]
              copy a client's MCP servers into mcpool settings
  setup-client CLIENT [--write] [--scope user|project]
              the snippet that points a client at `mcpool attach`
              (CLIENT: claude-code, claude-desktop, vscode, cursor, codex, gemini, qwen,
              copilot, opencode, cline)
  systemd-unit
              a systemd user unit running `mcpool daemon`
  --version   print the version

`daemonctl` inspects and controls a running daemon.
"""


# Imported only when chosen: none of them may slow down `mcpool attach`.
_LAZY = {
    "demo": ("mcpool.daemon._demo", "main"),
    "import": ("mcpool.daemon._import", "main"),
    "setup-client": ("mcpool.daemon._setup", "setup_client_main"),
    "systemd-unit": ("mcpool.daemon._setup", "systemd_unit_main"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command == "attach":
        from mcpool.daemon._attach import main as attach_main

        return attach_main(rest)
    if command == "daemon":
        # The daemon module lands separately; until then mypy cannot see it.
        from mcpool.daemon._daemon import (  # type: ignore[import-not-found, unused-ignore]
            main as daemon_main,
        )

        status: int = daemon_main(rest)
        return status
    if command in _LAZY:
        from importlib import import_module

        module, function = _LAZY[command]
        run = getattr(import_module(module), function)
        result: int = run(rest)
        return result
    if command == "--version":
        from mcpool import __version__

        sys.stdout.write(f"mcpool {__version__}\n")
        return 0
    if command in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    problem = f"unknown command {command!r}" if command else "a command is required"
    sys.stderr.write(f"{USAGE}\nmcpool: error: {problem}\n")
    return 2
