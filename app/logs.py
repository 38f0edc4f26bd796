"""Structured logs: one line per event, ``key=value`` (or JSON), each with the session it belongs to.

The session id lives in a context variable: the server sets it for a connection's tasks, and
threads started inside ``session_context`` (the pipeline's stages copy their creator's context)
see it too, so a stage's log line names its session.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time

SESSION: contextvars.ContextVar[str] = contextvars.ContextVar("voxlane_session", default="-")


@contextlib.contextmanager
def session_context(session_id: str):
    """Log lines emitted inside (and in threads started inside) carry ``session=session_id``."""
    token = SESSION.set(session_id)
    try:
        yield
    finally:
        SESSION.reset(token)


class SessionFilter(logging.Filter):
    """Adds ``record.session`` from the context."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session = SESSION.get()
        return True


class QueryStringFilter(logging.Filter):
    """Cuts the query string off every path in a record's arguments: ``/ws?token=…`` is logged as
    ``/ws?…``. uvicorn's access lines print the full path, and a query string can hold the token."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, str) and "?" in a for a in record.args):
            record.args = tuple(a.split("?", 1)[0] + "?…" if isinstance(a, str) and a.startswith("/") and "?" in a
                                else a for a in record.args)
        return True


def hide_query_strings() -> None:
    """Installs QueryStringFilter on uvicorn's loggers (idempotent)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, QueryStringFilter) for f in logger.filters):
            logger.addFilter(QueryStringFilter())


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... session=... msg="..."``: greppable, and parseable by log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = (f'ts={ts} level={record.levelname.lower()} logger={record.name} '
                f'session={getattr(record, "session", "-")} msg={json.dumps(record.getMessage())}')
        if record.exc_info:
            line += f" exc={json.dumps(self.formatException(record.exc_info))}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        body = {"ts": record.created, "level": record.levelname.lower(), "logger": record.name,
                "session": getattr(record, "session", "-"), "msg": record.getMessage()}
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body)


def setup_logging(level: str = "INFO", as_json: bool = False, stream=None) -> logging.Handler:
    """Routes every logger through one structured handler on stderr (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_voxlane", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._voxlane = True
    handler.addFilter(SessionFilter())
    handler.setFormatter(JsonFormatter() if as_json else KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
