"""RBAC as the API server's authorizer applies it to one token bound to one Role.

A request's attributes are read off its path the way the API server's request-info resolver reads them
(`/api/v1/namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]`, `/apis/GROUP/VERSION/...`), its verb off the
method (`get`/`list`/`watch`, `create`, `update`, `patch`, `delete`/`deletecollection`), and a Role's
rules allow it when one rule names its API group, its resource (`pods/exec` for a subresource, `*`
for any) and its verb. Exec over WebSocket is a GET, so `get` on `pods/exec`; clusters since 1.35
(`AuthorizePodWebsocketUpgradeCreatePermission`, on by default) also want `create` for the upgrade,
and so does this double.

Not modelled: ClusterRoles and their aggregation, non-resource URLs, `resourceNames` on `list`, and
the escalation checks of the RBAC API itself (the double does not serve RBAC objects).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, status_object
from .objects import JsonObj, as_list, as_obj

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<namespace>[^/]+)/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_WRITES = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True)
class Attributes:
    """What the authorizer decides on: `resource` carries its subresource (`pods/exec`)."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str

    def describe(self) -> str:
        return f"{self.verb} {self.resource}" + (f" ({self.group})" if self.group else "")


@dataclass(frozen=True)
class Rule:
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str]

    def allows(self, asked: Attributes) -> bool:
        return (
            ("*" in self.groups or asked.group in self.groups)
            and ("*" in self.resources or asked.resource in self.resources)
            and ("*" in self.verbs or asked.verb in self.verbs)
            and (not self.names or asked.name in self.names)
        )


def _strings(rule: JsonObj, key: str) -> frozenset[str]:
    values = rule.get(key)
    if values is None:
        return frozenset()
    strings = [value for value in as_list(values) if isinstance(value, str)]
    if not isinstance(values, list) or len(strings) != len(as_list(values)):
        raise ValueError(f"a Role rule's {key} must be a list of strings")
    return frozenset(strings)


def rules_of(role: JsonObj) -> tuple[str, list[Rule]]:
    """The namespace and the rules of a `rbac.authorization.k8s.io/v1` Role manifest."""
    if role.get("apiVersion") != "rbac.authorization.k8s.io/v1" or role.get("kind") != "Role":
        raise ValueError("expected an rbac.authorization.k8s.io/v1 Role")
    namespace = as_obj(role.get("metadata")).get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("the Role names no namespace")
    rules = [
        Rule(
            _strings(rule, "apiGroups"),
            _strings(rule, "resources"),
            _strings(rule, "verbs"),
            _strings(rule, "resourceNames"),
        )
        for rule in map(as_obj, as_list(role.get("rules")))
    ]
    return namespace, rules


def attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes | None:
    """The request's attributes, or None for what is not a namespaced resource (`/version`)."""
    found = _PATH.match(path)
    if not found:
        return None
    group = found["group"] or ""
    name = found["name"] or ""
    resource = found["resource"] + (f"/{found['sub']}" if found["sub"] else "")
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _WRITES.get(method, method.lower())
    return Attributes(verb, group, resource, found["namespace"], name)


@dataclass
class Grant:
    """One token's identity, its Role, and every request it made (allowed or not), in order."""

    user: str
    namespace: str
    rules: list[Rule]
    token: str
    asked: list[tuple[Attributes, bool]] = field(default_factory=lambda: [])

    def authorize(self, asked: Attributes | None, websocket: bool) -> None:
        """Raises the API server's 403 Forbidden when the Role does not allow the request."""
        if asked is None:
            return  # `/version` and discovery are open to every authenticated user
        needed = [asked]
        if websocket and asked.verb == "get":
            needed.append(Attributes("create", asked.group, asked.resource, asked.namespace, asked.name))
        for one in needed:
            allowed = one.namespace == self.namespace and any(rule.allows(one) for rule in self.rules)
            self.asked.append((one, allowed))
            if not allowed:
                raise _forbidden(self.user, one)


def _forbidden(user: str, asked: Attributes) -> ApiError:
    base = asked.resource.split("/")[0]
    subject = f'{base} "{asked.name}"' if asked.name else base
    if asked.group:
        subject = f'{base}.{asked.group} "{asked.name}"' if asked.name else f"{base}.{asked.group}"
    message = (
        f'{subject} is forbidden: User "{user}" cannot {asked.verb} resource "{asked.resource}" '
        f'in API group "{asked.group}" in the namespace "{asked.namespace}"'
    )
    details: dict[str, Any] = {"name": asked.name} if asked.name else {}
    if asked.group:
        details["group"] = asked.group
    details["kind"] = base
    return ApiError(status_object(403, "Forbidden", message, details))
