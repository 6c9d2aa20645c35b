"""The outbox in the admin, read-only, and the read-only admin base every app's worker-written
tables use."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from core.models import OutboxEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, never written: no Add, no Save, no Delete (a POST to the change page is a 403).

    A saved form writes back every field it showed, including what a worker changed after the
    page was opened: Save on a `retry_wait` message the worker had sent meanwhile put it back in
    `retry_wait` and sent it twice (issue 8). Operators act through the actions, which call the
    apps' conditional-UPDATE services (delivery.services.operator for messages).
    """

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Who may run the actions: whoever Django's "change" permission names (a superuser,
        or staff granted it), even though the form itself never saves."""
        meta = self.model._meta
        return request.user.has_perm(f"{meta.app_label}.change_{meta.model_name}")


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    """The relay's work list: deleting a row would lose the task it announces."""

    list_display = ("id", "kind", "payload", "created_at")
    list_filter = ("kind",)
