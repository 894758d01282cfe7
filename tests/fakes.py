"""Fakes of mcpool's own interfaces for socket-free, process-free pool and session tests.

`FakeNet` is the `upstream_factory=` hook of `Pool`: it builds a `FakeUpstream` (the interface the
pool uses of `StdioUpstream`) from a per-server `FakeServer` script. `FakeWriter` is the session's
`out`, with a `buffered` count and a `wait_drained` the test controls.
"""

from __future__ import annotations

import collections
import itertools
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import trio
from msgspec import UNSET, Raw, UnsetType

from mcpool.pool import (
    EntryKey,
    Handle,
    Pool,
    PoolEntry,
    PoolOptions,
    ServerSettings,
    Snapshot,
    TransportIdentity,
    UpstreamEvents,
    identity_of,
)
from mcpool.pool._upstream import Upstream
from mcpool.protocol import McpoolError, Message, UpstreamClosed, UpstreamUnavailable
from mcpool.session import Desired, PolicyKey, SessionView
from mcpool.session._observe import CallRecord, OutcomeName, SessionFacts

_pids = itertools.count(10_000)


def tool(name: str, description: str = "", **schema: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": description or f"the {name} tool",
        "inputSchema": {"type": "object", **schema},
    }


class FakeServer:
    """What one named upstream offers, and how its starts behave. Tests mutate it freely."""

    def __init__(
        self,
        tools: list[dict[str, Any]] | None = None,
        prompts: list[dict[str, Any]] | None = None,
        resources: list[dict[str, Any]] | None = None,
        instructions: str | None = None,
        resource_templates: list[dict[str, Any]] | None = None,
    ) -> None:
        self.tools = list(tools or [])
        self.prompts = list(prompts or [])
        self.resources = list(resources or [])
        self.resource_templates = list(resource_templates or [])
        self.instructions = instructions
        self.capabilities: dict[str, Any] = {"tools": {}, "prompts": {}, "resources": {}}
        self.start_failures = 0  # the next N starts raise before the handshake completes
        self.always_fail = False
        self.start_gate: trio.Event | None = None  # when set, run() waits on it before starting
        self.upstreams: list[FakeUpstream] = []

    @property
    def starts(self) -> int:
        return len(self.upstreams)

    @property
    def current(self) -> FakeUpstream:
        return self.upstreams[-1]


class FakeNet:
    """`Pool(upstream_factory=net.factory)`: one `FakeServer` per server name."""

    def __init__(self, **servers: FakeServer) -> None:
        self.servers = dict(servers)

    def factory(
        self,
        identity: TransportIdentity,
        events: UpstreamEvents,
        *,
        guardian: Any,
        max_line: int,
        handshake_timeout: float,
        roots: tuple[str, ...] = (),
    ) -> FakeUpstream:
        server = self.servers.setdefault(identity.name, FakeServer())
        upstream = FakeUpstream(server, identity, events, roots=roots)
        server.upstreams.append(upstream)
        return upstream


class FakeUpstream:
    """Mimics the part of `StdioUpstream` the pool and the session use; no process."""

    def __init__(
        self,
        server: FakeServer,
        identity: TransportIdentity,
        events: UpstreamEvents,
        *,
        roots: tuple[str, ...] = (),
    ) -> None:
        self.server = server
        self.identity = identity
        self.name = identity.name
        self.events = events
        self.roots = roots
        self.pid: int | None = None
        self.started_at: float | None = None
        self.closed_reason: str | None = None
        self.exit_status: int | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self.server_capabilities: dict[str, Any] = {}
        self.server_info: dict[str, Any] = {"name": identity.name}
        self.protocol_version: str | None = None
        self.instructions: str | None = None
        self.era = "handshake"
        self.sent: list[tuple[int, str, Any]] = []
        self.cancelled: list[tuple[int, str]] = []
        self.refused: list[tuple[Any, int, str]] = []  # server requests answered with an error
        self.answered: list[tuple[Any, Any, Any]] = []  # server requests the client answered
        self.notifications: list[tuple[str, Any]] = []
        self._pending: dict[int, Callable[[Message], None]] = {}
        self._settled = trio.Event()
        self.request_timeout = 600.0
        self._ids = itertools.count(1)
        self._running = False
        self._close = trio.Event()

    @property
    def alive(self) -> bool:
        return self._running and not self._close.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def wait_settled(self) -> None:
        while self._pending and self._running:
            self._settled = trio.Event()
            await self._settled.wait()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        server = self.server
        if server.start_gate is not None:
            await server.start_gate.wait()
        if server.always_fail or server.start_failures > 0:
            server.start_failures = max(0, server.start_failures - 1)
            self.closed_reason = "handshake failed"
            raise UpstreamUnavailable(self.name, f"server '{self.name}' failed to start")
        self.pid = next(_pids)
        self.started_at = trio.current_time()
        self.server_capabilities = dict(server.capabilities)
        self.instructions = server.instructions
        self.protocol_version = "2025-06-18"
        self._running = True
        task_status.started(self)
        try:
            await self._close.wait()
        finally:
            self._running = False
            pending, self._pending = self._pending, {}
            self._settled.set()
            for uid, reply in pending.items():
                reply(_error(uid, f"server '{self.name}' closed"))

    def request_close(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        self._close.set()

    def crash(self, status: int = 1) -> None:
        """The process exits on its own: the pool sees a failure and restarts."""
        self.request_close(f"exited with status {status}")

    async def call(
        self,
        method: str,
        params: Any = UNSET,
        *,
        timeout: float,  # noqa: ASYNC109
        decode_result: Callable[[Raw], Any] | None = None,
    ) -> Any:
        await trio.lowlevel.checkpoint()
        lists = {
            "tools/list": ("tools", self.server.tools),
            "prompts/list": ("prompts", self.server.prompts),
            "resources/list": ("resources", self.server.resources),
            "resources/templates/list": ("resourceTemplates", self.server.resource_templates),
        }
        if method in lists:
            field, items = lists[method]
            if decode_result is not None:  # as the real one: the result's bytes, decoded
                return decode_result(Raw(msgspec.json.encode({field: items})))
            return {field: [json.loads(json.dumps(i)) for i in items]}
        raise McpoolError(f"fake upstream: no {method}", server=self.name)

    def send_request(
        self, method: str, params: Raw | bytes | UnsetType, on_reply: Callable[[Message], None]
    ) -> int:
        if not self.alive:
            raise UpstreamClosed(self.name, f"server '{self.name}' is not running")
        uid = next(self._ids)
        raw = bytes(params) if isinstance(params, Raw | bytes) else b"null"
        self.sent.append((uid, method, msgspec.json.decode(raw)))
        self._pending[uid] = on_reply
        return uid

    def send_checked(
        self, method: str, params: Raw | bytes, on_reply: Callable[[Message], None]
    ) -> int:
        return self.send_request(method, params, on_reply)

    def reply(self, uid: int, result: Any) -> None:
        self._pending.pop(uid)(
            Message(jsonrpc="2.0", id=uid, result=Raw(msgspec.json.encode(result)))
        )
        if not self._pending:
            self._settled.set()

    def send_notification(self, method: str, params: Any = UNSET) -> None:
        self.notifications.append((method, params))

    def forget(self, uid: int) -> bool:
        return self._pending.pop(uid, None) is not None

    def cancel(self, uid: int, reason: str) -> None:
        if self.forget(uid):
            self.cancelled.append((uid, reason))

    def respond(self, msg_id: Any, result: Any) -> None:
        pass

    def respond_error(self, msg_id: Any, code: int, message: str, data: Any = UNSET) -> None:
        self.refused.append((msg_id, code, message))

    def respond_raw(self, msg_id: Any, result: Any, error: Any) -> None:
        self.answered.append((msg_id, result, error))

    def list_changed(self, kind: str = "tools") -> None:
        self.events.on_notification(f"notifications/{kind}/list_changed", UNSET)


def _error(uid: int, text: str) -> Message:
    return Message(
        jsonrpc="2.0",
        id=uid,
        error=Raw(msgspec.json.encode({"code": -32000, "message": text})),
    )


class BytesWriter:
    """The session's `out`, keeping the bytes exactly as written (batch arrays stay arrays)."""

    buffered = 0

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def write_lossy(self, data: bytes) -> bool:
        self.write(data)
        return True

    def write_parts(self, parts: Sequence[bytes]) -> None:
        self.write(b"".join(parts))

    async def wait_drained(self) -> None:
        await trio.lowlevel.checkpoint()


class FakeWriter:
    """The session's `out`. `block()` makes it look full until `unblock()`."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.buffered = 0
        self._drained = trio.Event()
        self._drained.set()
        self.drain_waits = 0
        self.lossy_dropped = 0  # lossy messages dropped while blocked

    def write(self, data: bytes) -> None:
        for line in data.splitlines():
            if line.strip():
                self.frames.append(json.loads(line))

    def write_lossy(self, data: bytes) -> bool:
        """As a real writer's: dropped (False) while it looks full (`block`)."""
        if self.buffered:
            self.lossy_dropped += 1
            return False
        self.write(data)
        return True

    def write_parts(self, parts: Sequence[bytes]) -> None:
        self.write(b"".join(parts))

    async def wait_drained(self) -> None:
        self.drain_waits += 1
        await self._drained.wait()

    def block(self) -> None:
        self.buffered = 1
        self._drained = trio.Event()

    def unblock(self) -> None:
        self.buffered = 0
        self._drained.set()

    def notifications(self, kind: str | None = None) -> list[str]:
        methods = [f.get("method", "") for f in self.frames if "id" not in f]
        if kind is None:
            return methods
        return [m for m in methods if m == f"notifications/{kind}/list_changed"]

    def responses(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if "id" in f and "method" not in f]


def stdio(name: str = "srv", **fields: Any) -> ServerSettings:
    """A stdio entry; policy and mcpool fields by their camelCase settings names."""
    raw: dict[str, Any] = {"command": f"/usr/bin/{name}-server", **fields}
    return msgspec.convert(raw, ServerSettings)


def desired(
    name: str, settings: ServerSettings, *, source: str | None = "/cfg.json", pool: bool = True
) -> Desired:
    key = PolicyKey.from_settings(settings)
    identity = identity_of(name, settings, policy=None if pool else key.encoded())
    return Desired(name, settings, identity, key, source)


def make_pool(nursery: trio.Nursery, net: FakeNet, **options: Any) -> Pool:
    return Pool(
        nursery,
        PoolOptions(**options),
        rng=random.Random(1234),
        upstream_factory=net.factory,  # type: ignore[arg-type]
    )


# -- views without a pool: a real PoolEntry and Handle, built by hand -----------------------------


class LogLines(list[str]):
    """A session's `log=`: the text of each line, with its level in `levels` (same order)."""

    def __init__(self) -> None:
        super().__init__()
        self.levels: list[str] = []

    def __call__(self, text: str, level: str = "warning") -> None:
        self.append(text)
        self.levels.append(level)

    def at(self, level: str) -> list[str]:
        return [text for text, lv in zip(self, self.levels, strict=True) if lv == level]


class NoSession:
    """Stands in for `Session` where a view's callbacks are never expected to fire."""

    name_budget = 64  # the default budget of a session whose client is not known

    def views_changed(self) -> None:
        raise AssertionError("no session listens here")


def entry_with(
    name: str,
    tools: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
    *,
    prompts: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
    resources: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
    generation: int = 1,
) -> PoolEntry:
    settings = stdio(name)
    ident = identity_of(name, settings)
    entry = PoolEntry(EntryKey(name, ident.fingerprint), ident, settings)
    entry.snapshot = Snapshot(
        generation=generation,
        available=True,
        tools=tuple(tools),
        prompts=tuple(prompts),
        resources=tuple(resources),
        capabilities={"tools": {}},
    )
    return entry


def view_on(
    entry: PoolEntry,
    *,
    key: PolicyKey | None = None,
    prefix: bool = True,
    name: str | None = None,
    session: Any = None,
) -> SessionView:
    view = SessionView(
        session if session is not None else NoSession(),  # type: ignore[arg-type]
        name or entry.name,
        key or PolicyKey(),
        prefix=prefix,
        source=None,
    )
    view.handle = Handle(entry, "s-test", entry.identity, entry.settings, view)
    return view


def republish(entry: PoolEntry, **changes: Any) -> None:
    """Publish the entry's next snapshot (generation + 1) with `changes`, without listeners."""
    snap = entry.snapshot
    entry.snapshot = msgspec.structs.replace(snap, generation=snap.generation + 1, **changes)


class NoUpstreamEvents:
    """An upstream's events going nowhere (for tests of one `Upstream`'s own code)."""

    def on_notification(self, method: str, params: Any) -> None:
        pass

    def on_server_request(self, upstream: Upstream, msg: Message) -> None:
        pass


class LineUpstream(Upstream):
    """The real `Upstream` code with the list of lines written to it for its wire."""

    def __init__(self, max_line: int = 1 << 22) -> None:
        super().__init__(
            identity_of("srv", stdio("srv")),
            NoUpstreamEvents(),
            max_line=max_line,
            handshake_timeout=5,
        )
        self.lines: list[bytes] = []

    @property
    def alive(self) -> bool:
        return True

    def _write(self, data: bytes) -> None:
        self.lines.append(data)

    def answer(self, uid: int) -> None:
        self._dispatch(b'{"jsonrpc":"2.0","id":%d,"result":{}}' % uid)


# What a session says of itself in its audit lines (session/_observe.py `CallTape.who`).
CLIENT_FACTS = ("codex-mcp-client", "0.171.0", "/home/u/project")


def call_record(
    server: str,
    method: str,
    name: str,
    started: float,
    ended: float,
    outcome: OutcomeName,
    code: int | None,
    bytes_in: int,
    bytes_out: int,
    session: str = "s1",
) -> CallRecord[Raw]:
    """A session's record of one answered request, from when it started and ended."""
    facts = SessionFacts(session, *CLIENT_FACTS)
    return CallRecord(
        Raw(msgspec.json.encode(facts)),
        started,
        server,
        method,
        name,
        bytes_in,
        (ended - started) * 1000.0,
        outcome,
        bytes_out,
        UNSET if code is None else code,
    )
