"""Policy keys: the canonical per-session, per-server view settings (DESIGN policy-key table).

| setting         | canonical behaviour                                                    |
| trust           | missing, false and true stay distinct                                  |
| alwaysLoadTools | only true enables eager loading; missing and false are equivalent      |
| includeTools    | presence matters (missing: all, []: none); order, duplicates ignored;  |
|                 | `foo(args)` is `foo`                                                   |
| excludeTools    | missing and [] are equivalent; order, duplicates ignored; exact names; |
|                 | exclude wins over include                                              |
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from mcpool.pool import ServerSettings

from ._interner import UNSHARED, Interner


class PolicyKey(msgspec.Struct, frozen=True, weakref=True):
    trust: bool | None = None
    include: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    always_load: bool = False

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
        )
        # One object per distinct policy: sessions sharing a policy share its key.
        fields = (key.trust, key.include, key.exclude, key.always_load)
        found: PolicyKey = interner.policies.intern(fields, key)
        return found

    def allows(self, name: str) -> bool:
        if name in self.exclude:
            return False
        return self.include is None or name in self.include

    def explain(self, name: str) -> tuple[bool, str]:
        """Whether `name` is visible and which rule decided it."""
        if name in self.exclude:
            return False, "excluded by excludeTools"
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
        }

    def encoded(self) -> str:
        return msgspec.json.encode(self.canonical()).decode()


# Interned by the fields rather than the key itself (which would keep every key alive): a policy
# is shared while some view holds it (`Interner.policies`).
PolicyFields = tuple[bool | None, frozenset[str] | None, frozenset[str], bool]


def normalize_include(name: str) -> str:
    """`run_shell_command(git status)` means the tool `run_shell_command` (gemini-cli's form)."""
    stripped = name.strip()
    if stripped.endswith(")") and "(" in stripped:
        return stripped[: stripped.index("(")].strip()
    return stripped
