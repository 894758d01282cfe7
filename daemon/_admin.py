"""The admin API's boundary: every `mcpool/admin/<command>`'s params as a typed value.

`daemonctl` (daemon/_ctl.py) is the client. Each command's params decode into one frozen Struct
here, before its handler runs, so a handler never meets a dict whose members may be any type. A
value that does not decode is an invalid-params error that names the field (`data.field`) and
says what was wrong (`data.reason`). Members a command does not know are ignored, so an older
daemon still answers a newer daemonctl.

Pure code (no I/O): the table of commands, their params and their handlers' names. The daemon
looks a command up here, decodes, and calls the handler of that name (`AdminApi`) with the Struct.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from mcpool.protocol import InvalidParams, MethodNotFound

PREFIX = "mcpool/admin/"
# `daemonctl logs` asks for 50 by default and `logs -f` for 1000; this answers a caller that names
# no count.
LOG_LINES_DEFAULT = 200
# Far more than any tail the daemon keeps (its own log's memory, a server's stderr tail): a larger
# count is a caller's mistake, refused rather than silently meaning "everything".
LOG_LINES_MAX = 100_000
# The environment variable that enables test-only commands (read once, at daemon start).
TEST_HOOKS_ENV = "MCPOOL_TEST_HOOKS"

NonEmpty = Annotated[str, Meta(min_length=1)]


class NoParams(Struct, frozen=True):
    """servers, sessions, stop, reload: nothing to say."""


class StatusParams(Struct, frozen=True):
    # A leak hunt asks for a full collection first (see `AdminApi._admin_status`).
    collect: bool = False


class ToolsParams(Struct, frozen=True):
    session: NonEmpty  # a session id or name
    server: str | None = None


class ExplainParams(Struct, frozen=True):
    session: NonEmpty
    name: str


class RestartParams(Struct, frozen=True):
    name: NonEmpty


class LogsParams(Struct, frozen=True):
    name: str | None = None  # a server's stderr; None: the daemon's own log
    lines: Annotated[int, Meta(ge=0, le=LOG_LINES_MAX)] = LOG_LINES_DEFAULT


class ChangesParams(Struct, frozen=True):
    server: str | None = None  # only this server's


class ApproveParams(Struct, frozen=True):
    server: NonEmpty
    tools: Annotated[list[NonEmpty], Meta(max_length=10_000)] = []  # none: all pending
    file: NonEmpty | None = None  # only in this settings file


class SetServerParams(Struct, frozen=True):
    session: NonEmpty
    name: NonEmpty
    entry: dict[str, Any]  # one server's settings, validated by the settings parser


class AttachParams(Struct, frozen=True, rename="camel"):
    """`mcpool/attach`, a bridge's first message (daemon/_attach.py builds it)."""

    sources: list[str] = []  # settings files, absolute paths
    cwd: str | None = None
    name: str = "session"  # an empty one (a client started in /) is "session" too
    handoff: bool = False  # the client's stdin and stdout came with the message (SCM_RIGHTS)
    # The values of the variables its settings reference (daemon/_expand.py).
    env: dict[str, str] = {}
    # `mcpool attach --max-name-length N` (session/_names.py holds it to a sane range).
    max_name_length: Annotated[int, Meta(ge=1, le=1024)] | None = None
    # `mcpool attach --tool-search on|off` (session/_toolsearch.py); None: the daemon's.
    tool_search: Literal["on", "off"] | None = None


class Command(Struct, frozen=True):
    params: type[Struct]
    handler: str  # the key of its handler in `AdminApi`'s table


COMMANDS: dict[str, Command] = {
    "status": Command(StatusParams, "status"),
    "servers": Command(NoParams, "servers"),
    "sessions": Command(NoParams, "sessions"),
    "tools": Command(ToolsParams, "tools"),
    "explain": Command(ExplainParams, "explain"),
    "stop": Command(NoParams, "stop"),
    "reload": Command(NoParams, "reload"),
    "restart": Command(RestartParams, "restart"),
    "logs": Command(LogsParams, "logs"),
    "setServer": Command(SetServerParams, "setServer"),
    "set-server": Command(SetServerParams, "setServer"),
    "set_server": Command(SetServerParams, "setServer"),
    # OAuth (daemon/_login.py): a server's name, as for restart.
    "login": Command(RestartParams, "login"),
    "loginWait": Command(RestartParams, "loginWait"),
    "logout": Command(RestartParams, "logout"),
    # The ledger's statistics (daemon/_ledger.py, _stats.py).
    "stats": Command(NoParams, "stats"),
    # Pins (daemon/_pinkeeper.py).
    "changes": Command(ChangesParams, "changes"),
    "approve": Command(ApproveParams, "approve"),
}

# Only with MCPOOL_TEST_HOOKS=1 in the daemon's environment: a test forces an unexpected error in
# one of the daemon's own tasks (not a fenced one) to check that a crash exits non-zero.
TEST_COMMANDS: dict[str, Command] = {
    "testCrash": Command(NoParams, "testCrash"),  # raises in the daemon's own nursery
    "testFail": Command(NoParams, "testFail"),  # raises in its handler (the admin fence's case)
}


def lookup(method: str, commands: dict[str, Command]) -> Command:
    """The command `method` names; MethodNotFound for anything else."""
    name = method.removeprefix(PREFIX)
    command = commands.get(name) if method.startswith(PREFIX) else None
    if command is None:
        raise MethodNotFound(method, f"no admin command {name!r}")
    return command


_FIELD = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def decode_params(command: Command, raw: Raw | UnsetType) -> Any:
    """`raw` as the command's params Struct; InvalidParams names the field that is wrong."""
    if raw is UNSET:
        raw = Raw(b"{}")
    try:
        return msgspec.json.decode(raw, type=command.params)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _FIELD.search(text)
        path = match.group(1) if match is not None else ""
        reason = text[: match.start()] if match is not None else text
        missing = _MISSING.search(reason)
        if missing is not None:
            path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        if not path:
            raise InvalidParams(f"params: {reason}") from None
        raise InvalidParams(f"{path}: {reason}", field=path) from None
    except msgspec.DecodeError as exc:  # the envelope decoded, so only nesting can fail here
        raise InvalidParams(f"params: {exc}") from None
    except RecursionError:
        raise InvalidParams("params nesting is deeper than the decoder allows") from None


__all__ = [
    "COMMANDS",
    "LOG_LINES_DEFAULT",
    "LOG_LINES_MAX",
    "PREFIX",
    "TEST_COMMANDS",
    "TEST_HOOKS_ENV",
    "ApproveParams",
    "AttachParams",
    "ChangesParams",
    "Command",
    "ExplainParams",
    "LogsParams",
    "NoParams",
    "RestartParams",
    "SetServerParams",
    "StatusParams",
    "ToolsParams",
    "decode_params",
    "lookup",
]
