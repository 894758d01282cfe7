"""The reconciler: desired settings versus held handles, as a list of actions (R1-R6).

Pure: it compares captured values only (transport identities captured when a handle was built,
policy keys captured by views), never lifecycle ids and never the caller's live settings
objects, so a healthy unpooled connection whose identity still matches is kept (I3) and a
settings object mutated in place cannot make an old transport look current (I2).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from mcpool.pool import ServerSettings, TransportIdentity

from ._policy import PolicyKey


class Desired(NamedTuple):
    name: str
    settings: ServerSettings
    identity: TransportIdentity
    key: PolicyKey
    source: str | None


class Held(NamedTuple):
    identity: TransportIdentity
    key: PolicyKey
    prefix: bool
    source: str | None
    usable: bool  # False when the handle was released or its entry is terminal (R4)


class ActionKind(enum.Enum):
    ACQUIRE = "acquire"
    REPLACE = "replace"  # R1: release, then acquire
    REFRESH = "refresh"  # R2: same identity, the view's key or placement changed
    KEEP = "keep"  # same identity, canonically equal view: no generation, no notification
    RELEASE = "release"


class Action(NamedTuple):
    kind: ActionKind
    name: str
    desired: Desired | None


def reconcile(desired: dict[str, Desired], held: dict[str, Held]) -> list[Action]:
    actions: list[Action] = []
    for name in held:
        if name not in desired:
            actions.append(Action(ActionKind.RELEASE, name, None))
    for name, d in desired.items():
        h = held.get(name)
        if h is None:
            actions.append(Action(ActionKind.ACQUIRE, name, d))
        elif h.identity != d.identity or not h.usable:
            actions.append(Action(ActionKind.REPLACE, name, d))
        elif h.key != d.key or h.prefix != d.settings.prefix or h.source != d.source:
            actions.append(Action(ActionKind.REFRESH, name, d))
        else:
            actions.append(Action(ActionKind.KEEP, name, d))
    return actions
