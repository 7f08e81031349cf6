"""Kubernetes `Status` error bodies for the API emulator.

Clients (kubectl, kubernetes_asyncio, sunkd's own client) parse every non-2xx body as a
`meta/v1 Status`; the constructors below copy the reasons, codes and message formats of
`k8s.io/apimachinery/pkg/api/errors/errors.go` (NewNotFound, NewAlreadyExists,
NewConflict, NewInvalid, NewBadRequest, NewTooManyRequests, NewResourceExpired, ...).
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]


class KubeAPIError(Exception):
    """An API failure that the HTTP layer renders as a `Status` with the same code."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JSON | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details = dict(self.details or {})
        if self.retry_after:
            details["retryAfterSeconds"] = self.retry_after
        if details:
            body["details"] = details
        return body


def qualified(resource: str, group: str) -> str:
    """`pods` for the core group, `leases.coordination.k8s.io` otherwise (errors.go)."""
    return f"{resource}.{group}" if group else resource


def _details(name: str, group: str, resource: str) -> JSON:
    details: JSON = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return details


def not_found(resource: str, group: str, name: str) -> KubeAPIError:
    return KubeAPIError(
        404,
        "NotFound",
        f'{qualified(resource, group)} "{name}" not found',
        _details(name, group, resource),
    )


def path_not_found() -> KubeAPIError:
    # What the apiserver's NotFound handler answers for unknown paths.
    return KubeAPIError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(resource: str, group: str, name: str) -> KubeAPIError:
    return KubeAPIError(
        409,
        "AlreadyExists",
        f'{qualified(resource, group)} "{name}" already exists',
        _details(name, group, resource),
    )


def conflict(resource: str, group: str, name: str, why: str | None = None) -> KubeAPIError:
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return KubeAPIError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        _details(name, group, resource),
    )


def invalid(
    kind: str, group: str, name: str, causes: list[tuple[str, str, str]],
    *, qualified_as: str | None = None,
) -> KubeAPIError:
    """422 Invalid; `causes` are (reason, field, message) like field.ErrorList. The message
    names the object as `Kind.group`, or as `qualified_as` (an update's resourceVersion
    check names the resource: `nodesets.sunkd.io "x" is invalid`)."""
    rendered = ", ".join(f"{field}: {message}" for _, field, message in causes)
    if len(causes) > 1:
        rendered = "[" + rendered + "]"
    details: JSON = {
        "name": name,
        "kind": kind,
        "causes": [
            # StatusCause.message is the error without its field (field.Error.ErrorBody).
            {"reason": reason, "message": message, "field": field}
            for reason, field, message in causes
        ],
    }
    if group:
        details["group"] = group
    subject = qualified_as or (f"{kind}.{group}" if group else kind)
    return KubeAPIError(422, "Invalid", f'{subject} "{name}" is invalid: {rendered}', details)


def bad_request(message: str) -> KubeAPIError:
    return KubeAPIError(400, "BadRequest", message, {})


def method_not_allowed(method: str) -> KubeAPIError:
    return KubeAPIError(
        405, "MethodNotAllowed", f"the server does not allow this method on the requested "
        f"resource ({method})", {},
    )


def unsupported_media_type(content_type: str) -> KubeAPIError:
    return KubeAPIError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        {},
    )


def unsupported_body(content_type: str) -> KubeAPIError:
    """415 for a create/update body the emulator cannot decode. The real server's text
    (apimachinery's NewUnsupportedMediaTypeError) lists what it accepts, protobuf included;
    the emulator lists what it accepts: it has no protobuf codec, so kubectl's typed clients
    (`kubectl create namespace`, which sends protobuf) get this instead of a 201."""
    note = " (the sunkd API emulator has no protobuf codec)" if "protobuf" in content_type else ""
    return KubeAPIError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        f"application/json, application/yaml{note}",
        {},
    )


def expired(message: str) -> KubeAPIError:
    # NewResourceExpired: reason Expired, code 410 (not "Gone").
    return KubeAPIError(410, "Expired", message, {})


def too_many_requests(message: str, causes: list[JSON] | None = None,
                      retry_after: int | None = None) -> KubeAPIError:
    details: JSON = {}
    if causes:
        details["causes"] = causes
    return KubeAPIError(429, "TooManyRequests", message, details, retry_after=retry_after)


def internal_error(message: str) -> KubeAPIError:
    return KubeAPIError(500, "InternalError", message, {"causes": [{"message": message}]})


def forbidden(message: str) -> KubeAPIError:
    return KubeAPIError(403, "Forbidden", message, {})


def from_injected(code: int) -> KubeAPIError:
    """Fault injection: a plausible Status for an arbitrary code."""
    reasons = {
        400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
        410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
        503: "ServiceUnavailable", 504: "Timeout",
    }
    return KubeAPIError(code, reasons.get(code, "InternalError"),
                        f"injected failure (HTTP {code})", {})
