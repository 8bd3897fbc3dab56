"""Errors: one exception class for every answer muster refuses, carrying the
problem+json fields, and one for a cluster that could not be reached."""

from __future__ import annotations

from typing import Any


class MusterError(Exception):
    """A 4xx or 5xx answer from a node (RFC 9457 problem+json).

    `status`, `title`, `detail` and `request_id` are the standard fields;
    `problem` is the whole body, with any extra fields the server added
    (`holder`, `position`, `state`, `task`, ...).
    """

    def __init__(self, status: int, problem: dict[str, Any], method: str = "", url: str = "") -> None:
        self.status = status
        self.problem = problem
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        self.request_id: str | None = problem.get("request_id")
        self.type: str = str(problem.get("type", "about:blank"))
        self.method = method
        self.url = url
        super().__init__(f"{status} {self.title}: {self.detail} ({method} {url}, request {self.request_id})")

    def __getattr__(self, name: str) -> Any:
        # Extra problem fields read as attributes: err.holder, err.position.
        problem = self.__dict__.get("problem", {})
        if name in problem:
            return problem[name]
        raise AttributeError(name)


class NotFound(MusterError):
    """404."""


class Conflict(MusterError):
    """409: a stale fencing token, a taken alias, a busy lock, ..."""


class Unavailable(MusterError):
    """Every node answered 5xx (or could not be reached) until the retry budget ran out."""


class ConnectError(Unavailable):
    """No node could be reached before the retry budget ran out."""

    def __init__(self, message: str, method: str = "", url: str = "") -> None:
        super().__init__(503, {"title": "Unreachable", "detail": message}, method, url)


def error_for(status: int, problem: dict[str, Any], method: str, url: str) -> MusterError:
    cls: type[MusterError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status >= 500:
        cls = Unavailable
    else:
        cls = MusterError
    return cls(status, problem, method, url)
