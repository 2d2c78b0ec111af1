"""Kubernetes `Status` error objects, as the API server writes them.

`ApiError` carries a ready-made `Status` body and its HTTP code; handlers raise it and the
server middleware writes it. The builders mirror `k8s.io/apimachinery/pkg/api/errors`.
"""

from __future__ import annotations

from .objects import JsonObj


class ApiError(Exception):
    """A request failure, rendered as a `Status` object with `status['code']` as HTTP status."""

    def __init__(self, status: JsonObj) -> None:
        super().__init__(status.get("message", ""))
        self.status = status

    @property
    def code(self) -> int:
        return int(self.status["code"])


def status_object(code: int, reason: str, message: str, details: JsonObj | None = None) -> JsonObj:
    """A failure `Status` as the API server serialises it (`details` only when given)."""
    status: JsonObj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        status["details"] = details
    status["code"] = code
    return status


def _details(name: str, group: str, kind: str) -> JsonObj:
    details: JsonObj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    return details


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    """404 for a named object; `resource` is the plural (`pods`), as the API server words it."""
    message = f'{_qualified(resource, group)} "{name}" not found'
    return ApiError(status_object(404, "NotFound", message, _details(name, group, resource)))


def no_such_path() -> ApiError:
    return ApiError(status_object(404, "NotFound", "the server could not find the requested resource", {}))


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    message = f'{_qualified(resource, group)} "{name}" already exists'
    return ApiError(status_object(409, "AlreadyExists", message, _details(name, group, resource)))


def bad_request(message: str) -> ApiError:
    return ApiError(status_object(400, "BadRequest", message))


def unauthorized() -> ApiError:
    return ApiError(status_object(401, "Unauthorized", "Unauthorized"))


def method_not_allowed() -> ApiError:
    return ApiError(
        status_object(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})
    )


def gone(message: str) -> ApiError:
    return ApiError(status_object(410, "Expired", message))


def internal_error(message: str) -> ApiError:
    return ApiError(
        status_object(500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]})
    )


class FieldError:
    """One cause of a 422 Invalid, like `field.Error` (`Required value`, `Invalid value: ...`)."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        self.reason = reason
        self.field = field
        self.message = message

    @classmethod
    def required(cls, field: str, detail: str = "") -> FieldError:
        return cls("FieldValueRequired", field, "Required value" + (f": {detail}" if detail else ""))

    @classmethod
    def invalid(cls, field: str, value: object, detail: str) -> FieldError:
        shown = f'"{value}"' if isinstance(value, str) else str(value)
        return cls("FieldValueInvalid", field, f"Invalid value: {shown}: {detail}")

    @classmethod
    def not_found(cls, field: str, value: str) -> FieldError:
        return cls("FieldValueNotFound", field, f'Not found: "{value}"')

    @classmethod
    def duplicate(cls, field: str, value: str) -> FieldError:
        return cls("FieldValueDuplicate", field, f'Duplicate value: "{value}"')

    @classmethod
    def forbidden(cls, field: str, detail: str) -> FieldError:
        return cls("FieldValueForbidden", field, f"Forbidden: {detail}")

    @classmethod
    def unsupported(cls, field: str, value: str, supported: list[str]) -> FieldError:
        choices = ", ".join(f'"{s}"' for s in supported)
        return cls("FieldValueNotSupported", field, f'Unsupported value: "{value}": supported values: {choices}')

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def invalid(kind: str, name: str, errors: list[FieldError], group: str = "") -> ApiError:
    """422 Invalid, message and causes formatted like `errors.NewInvalid`."""
    joined = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    details = _details(name, group, kind)
    details["causes"] = [{"reason": e.reason, "message": e.message, "field": e.field} for e in errors]
    message = f'{_qualified(kind, group)} "{name}" is invalid: {joined}'
    return ApiError(status_object(422, "Invalid", message, details))
