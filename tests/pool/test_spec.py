"""Transport identities and fingerprints (DESIGN I1-I3)."""

from __future__ import annotations

import copy
import gc

import msgspec
import pytest
from fakes import stdio

from mcpool.pool import ServerSettings, identity_of, redact_url, transport_kind
from mcpool.protocol import SettingsError


def fp(name: str = "srv", **fields: object) -> str:
    return identity_of(name, stdio(name, **fields)).fingerprint


def test_policy_and_cosmetic_fields_are_not_part_of_the_identity() -> None:
    plain = identity_of("srv", stdio())
    for fields in [
        {"trust": True},
        {"trust": False},
        {"includeTools": []},
        {"excludeTools": ["a"]},
        {"alwaysLoadTools": True},
        {"description": "words"},
        {"disabled": True},
        {"prefix": False},
    ]:
        assert identity_of("srv", stdio(**fields)) == plain, fields


@pytest.mark.parametrize(
    "fields",
    [
        {"args": ["x"]},
        {"env": {"K": "v"}},
        {"cwd": "/tmp"},
        {"timeout": 5000},
        {"scope": "session"},
        {"command": "/usr/bin/other"},
    ],
)
def test_transport_fields_change_the_fingerprint(fields: dict[str, object]) -> None:
    assert fp(**fields) != fp()


def test_env_and_header_order_do_not_change_the_fingerprint() -> None:
    assert fp(env={"A": "1", "B": "2"}) == fp(env={"B": "2", "A": "1"})
    a = msgspec.convert(
        {"httpUrl": "https://x/mcp", "headers": {"A": "1", "b": "2"}}, ServerSettings
    )
    b = msgspec.convert(
        {"httpUrl": "https://x/mcp", "headers": {"B": "2", "a": "1"}}, ServerSettings
    )
    assert identity_of("h", a).fingerprint == identity_of("h", b).fingerprint


def test_args_order_changes_the_fingerprint() -> None:
    assert fp(args=["a", "b"]) != fp(args=["b", "a"])


def test_fingerprint_is_stable_and_short() -> None:
    assert fp() == fp()
    assert len(fp()) == 12
    assert all(c in "0123456789abcdef" for c in fp())


def test_workspace_scope_includes_session_roots_and_shared_does_not() -> None:
    ws = stdio(scope="workspace")
    assert identity_of("s", ws, session_roots=("/a",)) != identity_of(
        "s", ws, session_roots=("/b",)
    )
    shared = stdio()
    assert identity_of("s", shared, session_roots=("/a",)) == identity_of(
        "s", shared, session_roots=("/b",)
    )


def test_relative_cwd_resolves_against_the_settings_folder() -> None:
    ident = identity_of("s", stdio(cwd="sub"), base_dir="/proj")
    assert ident.cwd == "/proj/sub"
    assert identity_of("s", stdio(), base_dir="/proj").cwd == "/proj"


def test_pool_off_policy_joins_the_identity() -> None:
    assert identity_of("s", stdio(), policy="a") != identity_of("s", stdio(), policy="b")
    assert identity_of("s", stdio(), policy="a") == identity_of("s", stdio(), policy="a")


def test_identity_is_captured_not_a_view_of_the_settings_object() -> None:
    settings = stdio(args=["a"], env={"K": "1"})
    ident = identity_of("s", settings)
    before = copy.deepcopy(ident)
    settings.args.append("b")
    settings.env["K"] = "2"
    settings.env["NEW"] = "x"
    assert ident == before
    assert isinstance(ident.args, tuple)
    assert isinstance(ident.env, tuple)


def test_identity_is_hashable() -> None:
    assert len({identity_of("s", stdio()), identity_of("s", stdio())}) == 1


def test_describe_never_shows_secret_values() -> None:
    settings = msgspec.convert(
        {
            "httpUrl": "https://user:pw@example.com/mcp?token=SECRET",
            "headers": {"Authorization": "Bearer SECRET"},
        },
        ServerSettings,
    )
    shown = str(identity_of("h", settings).describe())
    assert "SECRET" not in shown
    assert "pw" not in shown
    env_shown = str(identity_of("s", stdio(env={"API_KEY": "SECRET"})).describe())
    assert "SECRET" not in env_shown
    assert "API_KEY" in env_shown


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"command": "x"}, "stdio"),
        ({"httpUrl": "https://x"}, "http"),
        ({"url": "https://x"}, "sse"),
        ({"type": "http", "url": "https://x"}, "http"),
        ({"type": "sse", "url": "https://x"}, "sse"),
        ({"type": "streamable-http", "url": "https://x"}, "http"),
    ],
)
def test_transport_kind(fields: dict[str, object], kind: str) -> None:
    assert transport_kind("s", msgspec.convert(fields, ServerSettings)) == kind


def test_entry_without_command_or_url_is_a_settings_error() -> None:
    with pytest.raises(SettingsError):
        transport_kind("s", ServerSettings())


def test_captured_settings_and_identities_are_shared_while_held_and_forgotten_after() -> None:
    from mcpool.pool import PoolTables
    from mcpool.pool._spec import capture_settings

    tables = PoolTables()
    marker = "interning-probe-unique-arg"
    first = capture_settings(stdio(args=[marker]), tables)
    assert capture_settings(stdio(args=[marker]), tables) is first  # equal settings, one copy
    ident = identity_of("probe", stdio(args=[marker]), tables=tables)
    assert identity_of("probe", stdio(args=[marker]), tables=tables) is ident

    def held() -> tuple[bool, bool]:
        return (
            any(marker in s.args for s in tables.settings.values()),
            any(marker in i.args for i in tables.identities.values()),
        )

    assert held() == (True, True)
    del first, ident
    gc.collect()
    # A daemon that has seen a thousand projects keeps only what is still attached.
    assert held() == (False, False)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:99999/mcp", "http://127.0.0.1:99999/mcp"),
        ("http://[::1/mcp?token=SECRET", "http://[::1/mcp"),
        ("http://user:SECRET@[fe80::1%eth0:bad/mcp?k=SECRET#SECRET", "http://[fe80::1%eth0:bad/mcp"),
        ("https://user:SECRET@example.com:8443/mcp?token=SECRET", "https://example.com:8443/mcp"),
        ("http://[::1]:8080/mcp", "http://[::1]:8080/mcp"),
        ("http://h/mcp\nX-Injected: 1", "http://h/mcp\\nX-Injected: 1"),
        ("not a url at all ?SECRET", "not a url at all "),
        ("", ""),
    ],
)  # fmt: skip
def test_redact_url_is_total(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_describe_of_an_invalid_url_does_not_raise() -> None:
    settings = msgspec.convert({"httpUrl": "http://127.0.0.1:99999/mcp"}, ServerSettings)
    assert identity_of("h", settings).describe()["url"] == "http://127.0.0.1:99999/mcp"


def test_identity_redacts_its_env_and_header_values_in_any_quoted_form() -> None:
    settings = msgspec.convert(
        {"httpUrl": "https://x/mcp", "headers": {"Authorization": "Bearer s3cr3t-t0ken\n"}},
        ServerSettings,
    )
    ident = identity_of("h", settings)
    h11 = "LocalProtocolError: Illegal header value b'Bearer s3cr3t-t0ken\\n'"
    assert "s3cr3t" not in ident.redact(h11)
    assert "s3cr3t" not in ident.redact("sent Bearer s3cr3t-t0ken\nthen")
    stdio_ident = identity_of("s", stdio(env={"API_KEY": "k€y-SECRET", "LEVEL": "1"}))
    assert stdio_ident.redact("key k€y-SECRET, 'k\\xe2\\x82\\xacy-SECRET', exit 1") == (
        "key <redacted>, '<redacted>', exit 1"  # short values ("1") are not secrets
    )


def test_a_pinned_revision_is_another_connection() -> None:
    assert fp() != fp(protocolVersion="2025-06-18") != fp(protocolVersion="2026-07-28")
    assert fp(protocolVersion="2025-06-18") == fp(protocolVersion="2025-06-18")


def test_the_revisions_a_server_may_be_pinned_to_are_those_mcpool_speaks() -> None:
    from typing import get_args

    from mcpool.pool._spec import PinnedVersion
    from mcpool.protocol import HANDSHAKE_VERSIONS, MODERN_VERSION

    assert set(get_args(PinnedVersion)) == {*HANDSHAKE_VERSIONS, MODERN_VERSION}
