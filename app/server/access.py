"""Who may open a session: browser pages from this server (or listed origins), and anyone with
the access token when one is configured."""
from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from app.config import ServerConfig


def is_origin_allowed(origin: str | None, host_header: str | None, config: ServerConfig) -> bool:
    """Programs (no Origin header) are allowed; a browser page must come from this server or an
    allowed origin. Without this, any web page the user visits could talk to their assistant
    (a WebSocket is not bound by the same-origin policy)."""
    if not origin:
        return True
    if origin in config.allowed_origins:
        return True
    return bool(host_header) and urlsplit(origin).netloc.lower() == host_header.lower()


def is_token_valid(given: str, config: ServerConfig) -> bool:
    if not config.access_token:
        return True
    return hmac.compare_digest(given.encode(), config.access_token.encode())  # constant time
