"""Label and field selectors in the one form the backend uses: equality requirements joined by commas.

`labelSelector=key=value,...`, `fieldSelector=metadata.name=NAME` and a `podSelector` made of `matchLabels`.
Everything else Kubernetes accepts (`!=`, `in`/`notin`, existence, `matchExpressions`, other field labels)
is refused with the API server's 400 BadRequest wording, so a backend that starts sending it finds out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import bad_request
from .objects import JsonObj, as_obj

Selector = dict[str, str]  # key -> the value it must have

_EQUALITY = re.compile(r"\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*==?\s*([-A-Za-z0-9_.]*)\s*")
FIELD_LABELS = ("metadata.name", "metadata.namespace")


def parse_selector(text: str | None, *, fields: bool = False) -> Selector:
    """Parse a `labelSelector` (or, with `fields`, a `fieldSelector`) query parameter.

    Raises:
        ApiError: 400 BadRequest for anything but equality requirements (on the supported field labels).
    """
    selector: Selector = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        m = _EQUALITY.fullmatch(part)
        if m is None:
            raise bad_request(f"unable to parse requirement: {part.strip()!r} (the k8s test double serves key=value)")
        if fields and m.group(1) not in FIELD_LABELS:
            raise bad_request(f"field label not supported: {m.group(1)}")
        selector[m.group(1)] = m.group(2)
    return selector


def matches_labels(selector: Selector, labels: Mapping[str, Any] | None) -> bool:
    labels = labels or {}
    return all(key in labels and str(labels[key]) == value for key, value in selector.items())


def matches_fields(selector: Selector, obj: JsonObj) -> bool:
    metadata = as_obj(obj.get("metadata"))
    return all(str(metadata.get(path.removeprefix("metadata."), "")) == value for path, value in selector.items())
