"""The socket side: accepting connections (fenced), a connection's first message, attach and the
stdio hand-off, serving a session's lines and an admin caller's requests, the bridge sockets.

`ConnectionServer` is made by `Daemon.run` from the process, the session opener (`Sessions`), the
admin API and the listening socket; it owns what only connections use (the bridge sockets, the
detach pacer, the connections to linger on).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import stat
import struct
import sys
from collections.abc import Callable
from typing import Any

import trio

from mcpool import __version__
from mcpool.pool import (
    READ_CHUNK,
    READ_GONE,
    FdWriter,
    WriterClosed,
    read_some,
)
from mcpool.protocol import (
    ATTACH_FAILED,
    LineFramer,
    McpoolError,
    Message,
    MessageTooLarge,
    decode,
    error_response,
    notification,
    response,
)
from mcpool.session import Session, request_id

from . import _admin
from ._admin_api import AdminApi
from ._attached import SessionRecord
from ._core import DaemonProcess, error_line
from ._listener import FdReserve, ListenSocket
from ._sessions import Sessions
from ._settings import DaemonOptions

# The attach request decodes through the admin boundary's typed decoder (no handler: the
# connection code opens the session itself).
_ATTACH = _admin.Command(_admin.AttachParams, "attach")


FIRST_MESSAGE_TIMEOUT = 30.0  # a connection that says nothing is dropped after this


# After a refusal or an oversized message: time for the peer to read the error and close first.
CLOSE_LINGER = 1.0


# A handed-off session's last replies reach a client that is still reading within this; one that
# stopped reading must not hold the bridge (and the client waiting on it) open.
HANDOFF_DRAIN_BOUND = 1.0


# fds an attach may hand over (stdin, stdout); room for one more so that a sender of too many
# is seen (MSG_CTRUNC) rather than silently cut.
HANDOFF_FDS = 2


async def _recv_with_fds(raw: socket.socket, fds: list[int]) -> bytes:
    """`read_some` for a connection's first message, which may carry fds (SCM_RIGHTS); they are
    appended to `fds`, close-on-exec so that no upstream we spawn inherits a client's pipe."""
    space = socket.CMSG_SPACE((HANDOFF_FDS + 1) * 4)
    while True:
        await trio.lowlevel.wait_readable(raw.fileno())
        try:
            data, ancdata, _flags, _addr = raw.recvmsg(READ_CHUNK, space, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            continue
        except OSError:
            return b""
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(
                    int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)
                )
        return data


def _usable_stdio(fds: list[int]) -> bool:
    """Exactly a readable and a writable end of pipes or sockets: what a bridge hands over."""
    if len(fds) != HANDOFF_FDS:
        return False
    try:
        modes = [os.fstat(fd).st_mode for fd in fds]
    except OSError:
        return False
    return all(stat.S_ISFIFO(m) or stat.S_ISSOCK(m) for m in modes)


class _BridgeSockets:
    """The sockets of handed-off sessions' bridges, all watched by one task through one epoll
    set: a bridge that exits (or is killed) closes its socket, and that ends its session, so a
    client's server process and its session live and die together. A task per session would
    cost ~3 KB each; this costs a dict entry. When many bridges exit at once (an editor with
    hundreds of sessions quits), at most `per_pass` of their sessions are closed before the
    loop runs the other tasks again (epoll is level-triggered: the rest are reported on the next
    turn), so the sessions still attached keep being served meanwhile."""

    def __init__(self, per_pass: int) -> None:
        self._epoll = select.epoll()
        self._sessions: dict[int, Session] = {}
        self._per_pass = per_pass

    def add(self, fd: int, session: Session) -> None:
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
        self._sessions[fd] = session

    def remove(self, fd: int) -> None:
        if self._sessions.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    async def run(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            for fd, _events in self._epoll.poll(0, self._per_pass):
                session = self._sessions.get(fd)
                if session is None:
                    continue
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # a bridge sends nothing after its attach request but its end
                    self.remove(fd)
                    session.close("the attach bridge exited")

    def close(self) -> None:
        self._epoll.close()


class DetachPacer:
    """Turns to close a session whose client left, at most `per_pass` held at once, handed on
    in arrival order. A client closing hundreds of sessions wakes their readers together (trio
    wakes every ready fd's waiter in one pass); each then only parks here, and the closes run
    a few per pass, so the sessions still attached are served between them (issue 17). A
    parking lot, not a CapacityLimiter: that one raises and catches WouldBlock and keeps a
    borrower set for every waiter, a third more of the loop time of those wake-ups."""

    def __init__(self, per_pass: int) -> None:
        self._free = per_pass
        self._waiting = trio.lowlevel.ParkingLot()

    async def turn(self) -> None:
        """Wait for a turn, hold it across one checkpoint, hand it on."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            await self._waiting.park()  # unparked holding the turn its giver held
        try:
            await trio.lowlevel.checkpoint()
        finally:
            if self._waiting:
                self._waiting.unpark()
            else:
                self._free += 1


async def _linger_close(fd: int) -> None:
    """Half-close, then discard what the peer still sends until it closes (bounded).

    Closing a socket with unread input makes the kernel reset the connection: the peer's send
    fails with EPIPE and its read with ECONNRESET instead of the error line followed by EOF.
    """
    try:
        with socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM) as dup:
            dup.shutdown(socket.SHUT_WR)
    except OSError:
        return
    with trio.move_on_after(CLOSE_LINGER):
        while await read_some(fd):
            pass


def _at_fd_limit(first: Message) -> bytes:
    """The answer to a session that came in on the fd reserve, which is kept for admin calls."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return error_response(
        request_id(first),
        ATTACH_FAILED,
        "The daemon is at its open-file limit",
        {"reason": f"RLIMIT_NOFILE is {soft}; see `daemonctl status` and `daemonctl sessions`"},
    )


# Sessions whose clients left at once are closed this many per scheduler batch: a client closing
# hundreds of sessions must not hold the loop from the sessions still calling (issue 17).
DETACH_BATCH = 4


class ConnectionServer:
    def __init__(
        self,
        process: DaemonProcess,
        sessions: Sessions,
        admin: AdminApi,
        listen: ListenSocket,
        fd_reserve: FdReserve,
        options: Callable[[], DaemonOptions],
    ) -> None:
        self._process = process
        self._log = process.log
        self._sessions = sessions
        self._admin = admin
        self._listen = listen
        self._fd_reserve = fd_reserve
        self._options = options
        self.bridges = _BridgeSockets(DETACH_BATCH)
        self._detach_pacer = DetachPacer(DETACH_BATCH)
        self._linger: set[int] = set()  # connections closed for an error: half-close and drain

    async def run(self) -> None:
        """Accept connections, and watch the handed-off sessions' bridges, until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.bridges.run)
                await self._accept_loop()
        finally:
            self.bridges.close()

    async def _fail_and_close(self, fd: int, writer: FdWriter, exc: McpoolError) -> None:
        try:
            writer.write(error_line(None, exc))
        except Exception:
            return
        with trio.move_on_after(1.0):
            await writer.wait_drained()
        # Lingering waits on the peer: _serve_connection does it once the session is released.
        self._linger.add(fd)

    @staticmethod
    def _decode_or_refuse(line: bytes, writer: FdWriter) -> Message | list[Message] | None:
        """A line's message (or batch); None when it is not one, after answering the error (a
        peer that went away before reading it leaves `writer.closed` set: its connection ends)."""
        try:
            return decode(line)
        except McpoolError as exc:
            with contextlib.suppress(WriterClosed):
                writer.write(error_line(None, exc))
            return None

    async def _serve_admin(
        self, fd: int, writer: FdWriter, framer: LineFramer, first: Message, pending: list[bytes]
    ) -> None:
        """Answer admin requests in order until the caller closes, or goes away before it reads
        an answer: either ends this connection only."""
        if not await self._admin_request(writer, first):
            return
        queue = list(pending)
        while not self._process.stop_requested.is_set() or queue:
            while queue:
                decoded = self._decode_or_refuse(queue.pop(0), writer)
                if writer.closed:
                    return
                if decoded is None:
                    continue
                for msg in decoded if isinstance(decoded, list) else [decoded]:
                    if not await self._admin_request(writer, msg):
                        return
            data = await read_some(fd)
            if not data:
                return
            try:
                queue = framer.feed(data)
            except MessageTooLarge as exc:
                await self._fail_and_close(fd, writer, exc)
                return

    async def _admin_request(self, writer: FdWriter, msg: Message) -> bool:
        """Answer one admin request; False when its caller has gone."""
        answer = await self._admin.answer(msg)
        if answer is None:
            return True
        try:
            writer.write(answer)
        except WriterClosed as exc:
            method = msg.method if isinstance(msg.method, str) else ""
            self._log("info", f"admin caller of {method} went away before its answer: {exc}")
            return False
        return True

    async def _accept_loop(self) -> None:
        reserved = False  # the next connection is accepted with the fd reserve's room
        failing = False
        async with trio.open_nursery() as nursery:
            while True:
                listener = self._listen.listener
                assert listener is not None
                try:
                    conn, _ = await listener.accept()
                except trio.ClosedResourceError:
                    if self._listen.closed:
                        return  # shutdown closed the listener
                    continue  # re-created: accept on the new one
                except OSError as exc:
                    if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                        continue  # that peer left while it was being accepted
                    if exc.errno in (errno.EMFILE, errno.ENFILE) and self._fd_reserve.release():
                        self._log(
                            "warning",
                            f"accept failed at the open-file limit ({exc.strerror}): the fd "
                            "reserve lets one admin connection in",
                        )
                        reserved = True
                        continue
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        if not failing:  # once per run of failures, not ten lines a second
                            self._log("error", f"accept failed: {exc}")
                        failing = True
                        await trio.sleep(0.1)
                        continue
                    raise
                failing = False
                nursery.start_soon(self._serve_fenced, conn, reserved)
                reserved = False

    async def _serve_fenced(self, tsock: trio.socket.SocketType, reserved: bool) -> None:
        """One connection's task: whatever goes wrong in it ends that connection only (logged
        with its traceback), never the accept loop every later connection needs."""
        try:
            await self._serve_connection(tsock, reserved)
        except Exception as exc:
            self._process.log_fault("opening a connection", exc)

    async def _serve_connection(
        self, tsock: trio.socket.SocketType, reserved: bool = False
    ) -> None:
        """`reserved`: accepted with the fd reserve's room, for an admin request only."""
        fd = tsock.detach()
        raw = socket.socket(fileno=fd)
        try:
            creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer_pid, peer_uid, _ = struct.unpack("3i", creds)
            raw.setblocking(False)
            if peer_uid != os.getuid():
                self._log("warning", "refused a connection from another user", uid=peer_uid)
                with contextlib.suppress(OSError):
                    raw.send(
                        error_response(
                            None,
                            ATTACH_FAILED,
                            "Connection refused",
                            {"reason": f"uid {peer_uid} is not the daemon's uid {os.getuid()}"},
                        )
                    )
                await _linger_close(raw.fileno())
                return
            faulted = False
            try:
                await self._serve_peer(raw, peer_pid, reserved)
            except* Exception as exc:
                # The per-connection fence: a bug while serving one connection ends that
                # connection only, never the accept loop (and every other session with it).
                # `except*`: a cancellation travelling in the same group still propagates.
                self._process.log_fault("serving a connection", exc, peer=peer_pid)
                faulted = True
            if raw.fileno() in self._linger and not faulted:
                await _linger_close(raw.fileno())
        finally:
            self._linger.discard(raw.fileno())
            raw.close()
            if reserved:
                self._fd_reserve.refill()

    async def _serve_peer(self, raw: socket.socket, peer_pid: int, reserved: bool = False) -> None:
        """One connection: its first message says what it is (admin, attach, a raw client).

        Flat on purpose: a session's connection lives as long as the session, and each await
        level it sits under is a coroutine frame kept for that long (about 0.5 KB a level).
        """
        fd = raw.fileno()
        framer = LineFramer(self._options().max_message_bytes)
        # fds that came with the first message (an attach bridge handing over its stdio); a
        # session that takes them owns them, and whatever is not taken is closed on the way out.
        handed: list[int] = []
        try:
            async with trio.open_nursery() as nursery:
                # No writer task while nothing is queued: an idle session costs no task for it.
                writer = FdWriter(
                    fd, self._options().session_buffer_bytes, spawn=nursery.start_soon
                )
                first, pending = await self._read_first(raw, framer, writer, handed)
                if first is not None and str(first.method).startswith("mcpool/admin/"):
                    await self._serve_admin(fd, writer, framer, first, pending)
                elif first is not None and reserved:
                    writer.write(_at_fd_limit(first))
                elif first is not None:
                    opened = self._open_connection_session(
                        fd, writer, first, peer_pid, handed, nursery.start_soon
                    )
                    if opened is not None:
                        state, in_fd, out = opened
                        client_closed = False
                        try:
                            if in_fd == fd:
                                await self._run_session(state, fd, writer, framer, pending)
                            else:
                                fresh = LineFramer(self._options().max_message_bytes)
                                client_closed = await self._run_session(
                                    state, in_fd, out, fresh, []
                                )
                                with trio.move_on_after(HANDOFF_DRAIN_BOUND):
                                    await out.wait_drained()
                        finally:
                            if in_fd != fd:
                                self._end_handoff(fd, writer, state, in_fd, out, client_closed)
                if first is not None:
                    with trio.move_on_after(1.0):
                        await writer.wait_drained()
                nursery.cancel_scope.cancel()
        finally:
            for received in handed:
                os.close(received)

    async def _read_first(
        self, raw: socket.socket, framer: LineFramer, writer: FdWriter, handed: list[int]
    ) -> tuple[Message | None, list[bytes]]:
        """The connection's first message and the lines read behind it (None: it said nothing
        usable in time, or closed)."""
        fd = raw.fileno()
        pending: list[bytes] = []
        first: Message | None = None
        with trio.move_on_after(FIRST_MESSAGE_TIMEOUT):
            while first is None:
                data = await _recv_with_fds(raw, handed)
                if not data:
                    return None, []
                try:
                    lines = framer.feed(data)
                except MessageTooLarge as exc:
                    await self._fail_and_close(fd, writer, exc)
                    return None, []
                while lines and first is None:
                    line = lines.pop(0)
                    decoded = self._decode_or_refuse(line, writer)
                    if writer.closed:
                        return None, []  # refused, and the peer did not stay to read why
                    if decoded is None:
                        continue
                    if isinstance(decoded, list):
                        first = decoded[0]
                        pending.append(line)
                        break
                    first = decoded
                    if not (isinstance(first.method, str) and first.method.startswith("mcpool/")):
                        pending.append(line)
                pending.extend(lines)
        return first, pending

    def _open_connection_session(
        self,
        fd: int,
        writer: FdWriter,
        first: Message,
        peer_pid: int,
        handed: list[int],
        spawn: Any,
    ) -> tuple[SessionRecord, int, FdWriter] | None:
        """Open the session a connection's first message asks for and answer the attach: the
        state, the fd its client's messages arrive on and the writer its answers go to (the
        connection's own, or the handed-off stdin and stdout). None: refused (answered)."""
        handoff = False
        if first.method == "mcpool/attach":
            try:
                params = _admin.decode_params(_ATTACH, first.params)
            except McpoolError as exc:
                with contextlib.suppress(WriterClosed):  # a caller that left needs no answer
                    writer.write(error_line(request_id(first), exc))
                return None
            # abspath is string work on absolute paths (the bridge sends them): no I/O.
            sources = [os.path.abspath(p) for p in params.sources]
            cwd, name, env = params.cwd, params.name or "session", params.env
            handoff = params.handoff and _usable_stdio(handed)
            explicit_budget = params.max_name_length
            tool_search = params.tool_search
        else:
            sources, cwd, name, env = [self._sessions.config_path], None, "socket", None
            explicit_budget = tool_search = None
        in_fd, out = fd, writer
        if handoff:
            in_fd, out_fd = handed
            os.set_blocking(in_fd, False)
            os.set_blocking(out_fd, False)
            # The connection's nursery runs its drain task, so it can still drain once the
            # session's own nursery is gone.
            out = FdWriter(out_fd, self._options().session_buffer_bytes, spawn=spawn)
            handed.clear()  # the session's now: _end_handoff closes them
        attaching = first.method == "mcpool/attach"
        via = "attach" if handoff else "attach-relay" if attaching else "socket"
        state = self._sessions.open_session(
            out,
            name=name,
            sources=sources,
            peer=peer_pid,
            cwd=cwd,
            via=via,
            env=env,
            max_name_length=explicit_budget,
            tool_search=tool_search,
        )
        if handoff:
            # The bridge's end is watched by the daemon's one `_BridgeSockets` task, so a
            # handed-off session holds no task beyond a socket session's.
            self.bridges.add(fd, state.session)
        if attaching:
            try:
                writer.write(response(request_id(first), self._attach_result(state, handoff)))
            except WriterClosed:
                # The bridge went away before its answer: the session ends through the usual
                # path (its run sees it closed), releasing whatever it took.
                state.session.close("the attach bridge went away before its attach answer")
        return state, in_fd, out

    def _end_handoff(
        self,
        control_fd: int,
        control: FdWriter,
        state: SessionRecord,
        in_fd: int,
        out: FdWriter,
        client_closed: bool,
    ) -> None:
        """Release a handed-off session's fds and tell its bridge how it ended. Synchronous, so
        it runs in full even while the daemon is cancelling the connection (shutdown)."""
        self.bridges.remove(control_fd)
        self._linger.discard(in_fd)  # an oversized message's linger is the bridge socket's
        out_fd = out.fd
        out.close()
        for handed_fd in (in_fd, out_fd):
            trio.lowlevel.notify_closing(handed_fd)
            os.close(handed_fd)
        reason = state.session.close_reason or "the session ended"
        # A client that stopped reading its server's output (closed the pipe) has gone too.
        client_closed = client_closed or out.peer_gone
        with contextlib.suppress(WriterClosed):
            control.write(
                notification("mcpool/ended", {"reason": reason, "clientClosed": client_closed})
            )

    def _attach_result(self, state: SessionRecord, handoff: bool = False) -> dict[str, Any]:
        result = {
            "session": state.session.id,
            "daemonPid": self._process.pid,
            "version": __version__,
        }
        if handoff:
            result["handoff"] = True
        return result

    async def _run_session(
        self,
        state: SessionRecord,
        in_fd: int,
        writer: FdWriter,
        framer: LineFramer,
        pending: list[bytes],
    ) -> bool:
        """Serve one session until it ends; True when the client ended it (end of input)."""
        session = state.session
        client_closed = False
        try:
            # One fence around the whole read loop (not one per line): whatever escapes the
            # session's own handling, its notifier or its first reconciliation closes this
            # session with an answer to every request in flight, and the connection ends.
            try:
                async with trio.open_nursery() as nursery:
                    session.on_close = lambda _s: nursery.cancel_scope.cancel()
                    session.spawn = nursery.start_soon  # a notifier task only while one is due
                    nursery.start_soon(self._sessions.apply_to_session, state)
                    handle_line, feed, whole_line = (
                        session.handle_line,
                        framer.feed,
                        framer.whole_line,
                    )
                    for line in pending:
                        handle_line(line)
                    while not session.closed:
                        # `read_some`, inlined: one coroutine less per message.
                        await trio.lowlevel.wait_readable(in_fd)
                        try:
                            data = os.read(in_fd, READ_CHUNK)
                        except BlockingIOError:
                            continue
                        except OSError as exc:
                            if exc.errno not in READ_GONE:
                                raise
                            data = b""
                        if not data:
                            client_closed = True
                            await self._paced_detach()
                            break
                        one = whole_line(data)  # the hot path: one whole line, one read
                        if one is not None:
                            handle_line(one)
                            continue
                        try:
                            lines = feed(data)
                        except MessageTooLarge as exc:
                            await self._fail_and_close(in_fd, writer, exc)
                            break
                        for line in lines:
                            handle_line(line)
                    session.close("the client disconnected")
            except* Exception as exc:
                self._process.log_fault("serving a session", exc, session=session.id)
                session.close("internal error in mcpool (see the daemon log)")
        finally:
            self._sessions.close_session(state, "the client disconnected")
        return client_closed

    async def _paced_detach(self) -> None:
        """Wait for a turn to close: at most DETACH_BATCH closes run between two passes of the
        loop over the other tasks (the turn is held across one checkpoint)."""
        await self._detach_pacer.turn()
