"""Keyset pagination on the primary key: constant cost per page, even ten million rows deep."""

from __future__ import annotations

import re
from typing import Any

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request


class IdCursorPagination(CursorPagination):
    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request: Request) -> int:
        # DRF falls back to the default for a page_size it cannot read ("abc", 0) and cuts a
        # larger one to the maximum: a client's mistake silently changed its pages. The schema
        # declares 1..max_page_size, and that is what is taken.
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not re.fullmatch(r"[0-9]{1,9}", raw) or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError(
                {self.page_size_query_param: [f"give a whole number from 1 to {self.max_page_size}"]}
            )
        return int(raw)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_page_size, default=self.page_size)
            elif parameter["name"] == self.cursor_query_param:
                parameter["description"] = "a page's `next` or `previous` link holds it; an opaque token"
        return parameters

    def decode_cursor(self, request: Request) -> Any:
        # DRF answers a cursor it cannot decode with a 404, as if the page did not exist; it is
        # bad input in a query parameter, so a 400 naming it.
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError(
                {self.cursor_query_param: ["invalid cursor; follow a page's `next` or `previous` link"]}
            ) from None
