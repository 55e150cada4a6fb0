"""The scope of the request deadline: every REST, dashboard and admin request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from fleets.base.conf import haru_settings
from haru.postgres import deadline


class RequestDeadlineMiddleware:
    """Bound each database wait of the request by HARU_DB_REQUEST_DEADLINE_MS.

    First in MIDDLEWARE, so the session, authentication and login-throttling reads are inside
    it. Async under ASGI: the budget is a context variable, which Django's sync_to_async
    carries into the thread that runs the view and the other middleware.
    """

    sync_capable = True
    async_capable = True

    def __init__(
        self,
        get_response: Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]],
    ) -> None:
        self.get_response = get_response
        self.wait_s = haru_settings().db_request_deadline_ms / 1000
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self._acall(request)
        with deadline.scope(self.wait_s):
            return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        with deadline.scope(self.wait_s):
            return await self.get_response(request)  # type: ignore[misc]
