"""Label and field selectors: the `labelSelector`/`fieldSelector` query syntax and `LabelSelector` objects.

Semantics follow `k8s.io/apimachinery/pkg/labels`: `!=` and `notin` also match objects without the
key; an empty selector matches everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .errors import bad_request
from .objects import JsonObj, as_list, as_obj

Operator = Literal["=", "!=", "in", "notin", "exists", "!", "gt", "lt"]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^()]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_CMP_RE = re.compile(rf"^\s*({_KEY})\s*([<>])\s*(-?[0-9]+)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        match self.operator:
            case "=":
                return present and value in self.values
            case "!=":
                return not present or value not in self.values
            case "in":
                return present and value in self.values
            case "notin":
                return not present or value not in self.values
            case "exists":
                return present
            case "!":
                return not present
            case "gt" | "lt":
                if not present or not re.fullmatch(r"-?[0-9]+", value):
                    return False
                bound = int(next(iter(self.values)))
                return int(value) > bound if self.operator == "gt" else int(value) < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def is_empty(self) -> bool:
        return not self.requirements


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse the `labelSelector` query parameter.

    Raises:
        ApiError: 400 BadRequest for a malformed selector, as the API server answers.
    """
    if text is None or not text.strip():
        return LabelSelector()
    return LabelSelector(tuple(_parse_requirement(part) for part in _split_top_level(text)))


def _parse_requirement(part: str) -> Requirement:
    if m := _SET_RE.match(part):
        values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
        operator: Operator = "in" if m.group(2) == "in" else "notin"
        return Requirement(m.group(1), operator, values)
    if m := _EQ_RE.match(part):
        return Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", frozenset({m.group(3)}))
    if m := _CMP_RE.match(part):
        return Requirement(m.group(1), "gt" if m.group(2) == ">" else "lt", frozenset({m.group(3)}))
    if m := _EXISTS_RE.match(part):
        return Requirement(m.group(2), "!" if m.group(1) else "exists")
    raise bad_request(f"unable to parse requirement: {part.strip()!r}")


def selector_from_object(selector: JsonObj) -> LabelSelector:
    """A `metav1.LabelSelector` (`matchLabels` + `matchExpressions`); `{}` selects everything."""
    requirements = [
        Requirement(str(k), "=", frozenset({str(v)})) for k, v in as_obj(selector.get("matchLabels")).items()
    ]
    operators: dict[str, Operator] = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for item in as_list(selector.get("matchExpressions")):
        expression = as_obj(item)
        operator = operators.get(str(expression.get("operator", "")))
        if operator is None:
            raise bad_request(f"{expression.get('operator')!r} is not a valid label selector operator")
        values = frozenset(str(v) for v in as_list(expression.get("values")))
        requirements.append(Requirement(str(expression.get("key")), operator, values))
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[tuple[str, bool, str], ...] = ()  # (field, equal?, value)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, f) == v) == eq for f, eq, v in self.requirements)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    current: Any = obj
    for part in path.split("."):
        current = as_obj(current).get(part)
    return "" if current is None else str(current)


def parse_field_selector(text: str | None, supported: frozenset[str]) -> FieldSelector:
    """Parse `fieldSelector` (`=`, `==`, `!=` on the fields the resource supports).

    Raises:
        ApiError: 400 BadRequest for a malformed selector or an unsupported field.
    """
    if text is None or not text.strip():
        return FieldSelector()
    requirements: list[tuple[str, bool, str]] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*", part)
        if m is None:
            raise bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
        if m.group(1) not in supported:
            raise bad_request(f"field label not supported: {m.group(1)}")
        requirements.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return FieldSelector(tuple(requirements))
