"""An entry's `"oauth"` settings and their canonical form (part of its transport identity).

Apart from the OAuth flow (pool/_oauth.py) so that the settings types (pool/_spec.py) read it
without importing the flow, which reads them.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

import msgspec


class OAuthSettings(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """An entry's `"oauth"` object, the shape gemini-cli and Claude Code use. Unknown fields
    (gemini's authorizationUrl, tokenUrl, audiences...) are ignored: discovery finds those."""

    enabled: bool = True
    client_id: str | None = None
    client_secret: str | None = None
    scopes: list[str] | None = None
    callback_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    # A client ID metadata document (an https URL with a path) to use as the client_id when
    # the authorization server supports them, instead of registering.
    client_metadata_url: str | None = None

    def __post_init__(self) -> None:
        # Checked here so that the settings file's error names it, not a failed connection.
        url = urlsplit(self.client_metadata_url) if self.client_metadata_url else None
        if url is not None and (url.scheme != "https" or url.path in ("", "/")):
            raise ValueError("clientMetadataUrl must be an https URL with a path")


_canonical = msgspec.json.Encoder(order="deterministic")


def oauth_identity(settings: OAuthSettings | None) -> str | None:
    """The canonical form of an entry's OAuth settings, part of its transport identity."""
    return None if settings is None else _canonical.encode(settings).decode()
