"""JSON object helpers: the double keeps every API object as a plain `dict` in wire format."""

from __future__ import annotations

from typing import Any, cast

JsonObj = dict[str, Any]


def as_obj(value: Any) -> JsonObj:
    """`value` if it is a JSON object, else `{}` (absent or malformed optional fields)."""
    return cast(JsonObj, value) if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """`value` if it is a JSON array, else `[]`."""
    return cast(list[Any], value) if isinstance(value, list) else []
