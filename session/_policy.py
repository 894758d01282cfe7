"""Policy keys: the canonical per-session, per-server view settings (DESIGN policy-key table).

| setting         | canonical behaviour                                                    |
| trust           | missing, false and true stay distinct                                  |
| alwaysLoadTools | only true enables eager loading; missing and false are equivalent      |
| includeTools    | presence matters (missing: all, []: none); order, duplicates ignored;  |
|                 | `foo(args)` is `foo`                                                   |
| excludeTools    | missing and [] are equivalent; order, duplicates ignored; exact names; |
|                 | exclude wins over include                                              |
| pinning         | missing: the daemon's; "warn", "hold", "off" (session/_pins.py)        |

A view serves through its settings' key with the names pinning holds added (`holding`): the
key every filter reads (projection, calls, fallbacks, explain), so a held tool is as hidden as an
excluded one, and its settings key stays what reconciling compares.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from mcpool.pool import PinningMode, ServerSettings

from ._interner import UNSHARED, Interner


class PolicyKey(msgspec.Struct, frozen=True, weakref=True):
    trust: bool | None = None
    include: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    always_load: bool = False
    pinning: PinningMode | None = None
    # Names (tools and prompts) whose definition changed since pinned and is not approved
    # (pinning "hold"): never from settings, only from `holding`.
    held: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, s: ServerSettings, interner: Interner = UNSHARED) -> PolicyKey:
        key = cls(
            trust=None if s.trust is UNSET else bool(s.trust),
            include=(
                None
                if s.include_tools is UNSET
                else frozenset(normalize_include(n) for n in s.include_tools)
            ),
            exclude=frozenset(() if s.exclude_tools is UNSET else s.exclude_tools),
            always_load=s.always_load_tools is True,
            pinning=s.pinning,
        )
        return key._interned(interner)

    def _interned(self, interner: Interner) -> PolicyKey:
        # One object per distinct policy: sessions sharing a policy share its key.
        fields = (
            self.trust,
            self.include,
            self.exclude,
            self.always_load,
            self.pinning,
            self.held,
        )
        found: PolicyKey = interner.policies.intern(fields, self)
        return found

    def holding(self, held: frozenset[str], interner: Interner = UNSHARED) -> PolicyKey:
        """This key with `held` (and only those) held: itself when they are already."""
        if held == self.held:
            return self
        return msgspec.structs.replace(self, held=held)._interned(interner)

    def allows(self, name: str) -> bool:
        if name in self.exclude or name in self.held:
            return False
        return self.include is None or name in self.include

    def explain(self, name: str) -> tuple[bool, str]:
        """Whether `name` is visible and which rule decided it."""
        if name in self.exclude:
            return False, "excluded by excludeTools"
        if name in self.held:
            return False, (
                "held by pinning: its definition changed since it was pinned and the change "
                "is not approved (`daemonctl changes` shows it, `daemonctl approve` serves it)"
            )
        if self.include is None:
            return True, "no includeTools: every tool is allowed"
        if name in self.include:
            return True, "listed in includeTools"
        return False, "not listed in includeTools"

    def canonical(self) -> dict[str, Any]:
        return {
            "trust": self.trust,
            "includeTools": None if self.include is None else sorted(self.include),
            "excludeTools": sorted(self.exclude),
            "alwaysLoadTools": self.always_load,
            **({"pinning": self.pinning} if self.pinning is not None else {}),
        }

    def encoded(self) -> str:
        return msgspec.json.encode(self.canonical()).decode()


# Interned by the fields rather than the key itself (which would keep every key alive): a policy
# is shared while some view holds it (`Interner.policies`).
PolicyFields = tuple[
    bool | None, frozenset[str] | None, frozenset[str], bool, PinningMode | None, frozenset[str]
]


def normalize_include(name: str) -> str:
    """`run_shell_command(git status)` means the tool `run_shell_command` (gemini-cli's form)."""
    stripped = name.strip()
    if stripped.endswith(")") and "(" in stripped:
        return stripped[: stripped.index("(")].strip()
    return stripped
