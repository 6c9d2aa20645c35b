"""Keyset pagination on the primary key: constant cost per page, even ten million rows deep."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request


class IdCursorPagination(CursorPagination):
    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000

    def decode_cursor(self, request: Request) -> Any:
        # DRF answers a cursor it cannot decode with a 404, as if the page did not exist; it is
        # bad input in a query parameter, so a 400 naming it.
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError(
                {self.cursor_query_param: ["invalid cursor; follow a page's `next` or `previous` link"]}
            ) from None
