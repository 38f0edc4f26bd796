"""Who may reach the server: which ``Host`` names it answers to (DNS rebinding), which browser
origins it serves (its own and ``server.allowed_origins``), and who holds the access token.

Pure functions of the config and one request's headers, so app/server/gate.py stays a thin
ASGI layer and each rule is testable on its own.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, urlsplit

from app.config import ServerConfig

COOKIE_NAME = "voxlane_token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def host_name(host_header: str) -> str:
    """``"Example.org:7860"`` -> ``"example.org"``; ``"[::1]:7860"`` -> ``"::1"``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_host_names(config: ServerConfig, local_ip: str | None) -> set[str]:
    """The names this server answers to: the address the connection came in on (the bound one, or
    for a wildcard bind the interface's), the loopback names when that is loopback, and
    ``server.allowed_hosts``. A page on ``evil.example`` that rebinds to our address sends
    ``Host: evil.example`` and is refused."""
    names = {name.lower() for name in config.allowed_hosts}
    for address in (config.host, local_ip):
        if address and (ip := _ip(address)) is not None and not ip.is_unspecified:
            names.add(str(ip))
            if ip.is_loopback:
                names.update(LOOPBACK_NAMES)
        elif address and _ip(address) is None:
            names.add(address.lower())  # a host name in server.host
    return names


def is_host_allowed(host_header: str | None, config: ServerConfig, local_ip: str | None) -> bool:
    if "*" in config.allowed_hosts:
        return True
    if not host_header:
        return False  # HTTP/1.1 requires Host; without one there is nothing to check against
    return host_name(host_header) in allowed_host_names(config, local_ip)


def own_origins(config: ServerConfig, local_ip: str | None, port: int | None) -> set[str]:
    """The origins of pages this server itself serves: scheme://name:port for each allowed name."""
    origins = set()
    for name in allowed_host_names(config, local_ip):
        if name == "*":
            continue
        netloc = f"[{name}]" if ":" in name else name
        for scheme, default_port in (("http", 80), ("https", 443)):
            # A browser leaves the scheme's default port out of the Origin.
            origins.add(f"{scheme}://{netloc}" if port in (None, default_port) else f"{scheme}://{netloc}:{port}")
    return origins


def is_origin_allowed(origin: str | None, config: ServerConfig, local_ip: str | None, port: int | None) -> bool:
    """Programs (no Origin header) are allowed; a browser page must come from this server's own
    origins or ``server.allowed_origins``, compared with the configuration, never with the request's
    own Host header (which a rebinding page controls)."""
    if origin is None:
        return True
    origin = origin.strip().lower().rstrip("/")
    if origin in {o.lower().rstrip("/") for o in config.allowed_origins}:
        return True
    return origin in own_origins(config, local_ip, port)


def is_token_valid(given: str, config: ServerConfig) -> bool:
    if not config.access_token:
        return True
    return hmac.compare_digest(given.encode(), config.access_token.encode())  # constant time


def cookie_value(config: ServerConfig) -> str:
    """What the browser's cookie holds: derived from the token, so the cookie jar never stores it."""
    return hmac.new(config.access_token.encode(), b"voxlane browser cookie", hashlib.sha256).hexdigest()


def is_request_authorized(headers, query_string: bytes, config: ServerConfig, allow_query: bool = False) -> bool:
    """The token as ``Authorization: Bearer``, as the page's cookie, or (``allow_query``: /ws only)
    as ``?token=``. Always true when no token is configured."""
    if not config.access_token:
        return True
    header = headers.get("authorization", "")
    if header[:7].lower() == "bearer " and is_token_valid(header[7:].strip(), config):
        return True
    cookie = _cookie(headers.get("cookie", ""))
    if cookie and hmac.compare_digest(cookie.encode(), cookie_value(config).encode()):
        return True
    if allow_query:
        given = parse_qs(query_string.decode("latin-1")).get("token", [""])[0]
        return is_token_valid(given, config)
    return False


def _cookie(header: str) -> str:
    try:
        morsel = SimpleCookie(header).get(COOKIE_NAME)
    except CookieError:
        return ""
    return morsel.value if morsel is not None else ""


def is_remote_url(path: str) -> bool:
    """Gradio's ``/file=<url>`` fetches a public URL for the caller: never from this server."""
    target = path.split("/file=", 1)[1] if "/file=" in path else ""
    return "://" in target or target.startswith("//") or urlsplit(target).scheme in ("http", "https")
