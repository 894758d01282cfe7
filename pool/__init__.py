"""mcpool.pool: upstream servers keyed by transport identity, shared between sessions."""

from ._entry import (
    LOGIN_NEEDED,
    TERMINAL_STATES,
    EntryEvent,
    EntryKey,
    EntryListener,
    EntryState,
    Handle,
    PoolEntry,
    close_deadline,
    next_idle_since,
    transition,
)
from ._eras import BOTH as BOTH_ERAS
from ._eras import (
    MODERN_ONLY,
    Discovered,
    discovered,
    listen_filter,
    wrap_output_schemas,
    wrap_structured,
)
from ._fdio import READ_CHUNK, READ_GONE, FdWriter, WriterClosed, read_some
from ._guardian import Guardian
from ._pool import (
    CRASH_LOOP_COOLDOWN,
    Pool,
    PoolOptions,
    RefreshRejected,
    attach_retry_due,
    backoff_delay,
    discover,
    is_crash_loop,
)
from ._reuse import spliced
from ._snapshot import Snapshot
from ._snapshots import (
    SNAPSHOT_FORMAT,
    EncodedList,
    MemorySnapshotStore,
    SnapshotStore,
    StoredSnapshot,
)
from ._spec import (
    UNSHARED_TABLES,
    PinningMode,
    PoolTables,
    ServerSettings,
    TransportIdentity,
    identity_of,
    redact_url,
    transport_kind,
)
from ._upstream import StdioUpstream, Upstream, UpstreamEvents

__all__ = [
    "BOTH_ERAS",
    "CRASH_LOOP_COOLDOWN",
    "LOGIN_NEEDED",
    "MODERN_ONLY",
    "READ_CHUNK",
    "READ_GONE",
    "SNAPSHOT_FORMAT",
    "TERMINAL_STATES",
    "UNSHARED_TABLES",
    "Discovered",
    "EncodedList",
    "EntryEvent",
    "EntryKey",
    "EntryListener",
    "EntryState",
    "FdWriter",
    "Guardian",
    "Handle",
    "MemorySnapshotStore",
    "PinningMode",
    "Pool",
    "PoolEntry",
    "PoolOptions",
    "PoolTables",
    "RefreshRejected",
    "ServerSettings",
    "Snapshot",
    "SnapshotStore",
    "StdioUpstream",
    "StoredSnapshot",
    "TransportIdentity",
    "Upstream",
    "UpstreamEvents",
    "WriterClosed",
    "attach_retry_due",
    "backoff_delay",
    "close_deadline",
    "discover",
    "discovered",
    "identity_of",
    "is_crash_loop",
    "listen_filter",
    "next_idle_since",
    "read_some",
    "redact_url",
    "spliced",
    "transition",
    "transport_kind",
    "wrap_output_schemas",
    "wrap_structured",
]
