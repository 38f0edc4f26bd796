"""Typed settings from TOML: a nested dataclass is filled from a dict, and every problem names
the file, the dotted key and what is wrong. Used for the app config and for personas."""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class SchemaError(ValueError):
    """One or more invalid settings; ``problems`` holds (key, message) pairs."""

    def __init__(self, source: str | Path, problems: list[tuple[str, str]]):
        self.source = str(source)
        self.problems = problems
        lines = "\n".join(f"  {key or '(top level)'}: {msg}" for key, msg in problems)
        super().__init__(f"{self.source}: invalid settings\n{lines}")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str, problems: list[tuple[str, str]]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _convert(value, inner[0], key, problems)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append((key, f"must be a table, got {type(value).__name__}"))
            return None
        return _build(tp, value, f"{key}.", problems)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            problems.append((key, f"must be a list, got {type(value).__name__}"))
            return None
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_convert(v, item_tp, f"{key}[{i}]", problems) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is Path and isinstance(value, str):
        return Path(value)  # "~" is expanded where the path is used
    if isinstance(tp, type) and not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        problems.append((key, f"must be {_type_name(tp)}, got {type(value).__name__} {value!r}"))
        return None
    return value


def _build(cls: type[T], data: dict, prefix: str, problems: list[tuple[str, str]]) -> T | None:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for unknown in sorted(set(data) - set(fields)):
        known = ", ".join(fields)
        problems.append((f"{prefix}{unknown}", f"unknown key (known keys: {known})"))
    kwargs = {}
    before = len(problems)
    for name, value in data.items():
        if name in fields:
            kwargs[name] = _convert(value, hints[name], f"{prefix}{name}", problems)
    if len(problems) > before:
        return None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as error:
        # __post_init__ raises "field: message" so the key can be named precisely
        text = str(error)
        field_name, sep, message = text.partition(": ")
        if sep and field_name in fields:
            problems.append((f"{prefix}{field_name}", message))
        else:
            problems.append((prefix.rstrip("."), text))
        return None


def build(cls: type[T], data: dict, source: str | Path, prefix: str = "") -> T:
    """Fill dataclass ``cls`` from ``data``; raise SchemaError listing every problem."""
    problems: list[tuple[str, str]] = []
    result = _build(cls, data, f"{prefix}." if prefix else "", problems)
    if problems or result is None:
        raise SchemaError(source, problems or [("", "invalid")])
    return result


def check(condition: bool, field: str, message: str) -> None:
    """For __post_init__: raise in the form ``build`` turns into a keyed problem."""
    if not condition:
        raise ValueError(f"{field}: {message}")
