"""Import jobs: `GET /api/v1/imports/{id}`, its rejected rows (paginated and as CSV), duplicates.

The upload itself is `POST /api/v1/contacts/import` (campaigns.api.contacts), which answers 202
with the job; the job runs on a worker (campaigns.import_jobs).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.views import APIView

from campaigns import import_jobs
from campaigns.api.pagination import IdCursorPagination
from campaigns.models import ImportIssue, ImportJob
from core import api_input
from core.api_negotiation import IgnoreAccept


class ImportJobSerializer(api_input.ModelSerializer):
    list_id = serializers.IntegerField(source="contact_list_id", allow_null=True, read_only=True)
    list_name = serializers.CharField(
        read_only=True, help_text="the list requested; created when the job runs"
    )
    rows = serializers.IntegerField(source="rows_read", read_only=True, help_text="data records read so far")
    imported = serializers.IntegerField(source="rows_imported", read_only=True)
    created = serializers.IntegerField(source="rows_created", read_only=True)
    updated = serializers.IntegerField(source="rows_updated", read_only=True)
    duplicates = serializers.IntegerField(source="rows_duplicate", read_only=True)
    rejected = serializers.IntegerField(source="rows_rejected", read_only=True)
    error = serializers.CharField(read_only=True, help_text="why the job failed, or the last run's error")
    rejections_url = serializers.SerializerMethodField()
    rejections_csv_url = serializers.SerializerMethodField()
    duplicates_url = serializers.SerializerMethodField()

    class Meta:
        model = ImportJob
        fields = [
            "id",
            "status",
            "filename",
            "size",
            "list_id",
            "list_name",
            "rows",
            "imported",
            "created",
            "updated",
            "duplicates",
            "rejected",
            "added_to_list",
            "error",
            "attempts",
            "created_at",
            "started_at",
            "finished_at",
            "rejections_url",
            "rejections_csv_url",
            "duplicates_url",
        ]
        read_only_fields = fields

    def _url(self, name: str, job: ImportJob) -> str:
        url = reverse(name, kwargs={"pk": job.pk})
        request = self.context.get("request")
        return request.build_absolute_uri(url) if request is not None else url

    def get_rejections_url(self, job: ImportJob) -> str:
        return self._url("import-rejections", job)

    def get_rejections_csv_url(self, job: ImportJob) -> str:
        return self._url("import-rejections-csv", job)

    def get_duplicates_url(self, job: ImportJob) -> str:
        return self._url("import-duplicates", job)


class ImportIssueSerializer(api_input.ModelSerializer):
    class Meta:
        model = ImportIssue
        fields = ["line", "reason", "excerpt"]
        read_only_fields = fields


class LineCursorPagination(IdCursorPagination):
    """In file order; the cursor is a line number, so page N costs what page 1 does."""

    ordering = "line"
    page_size = 500
    max_page_size = 5_000


class ImportJobDetailView(generics.RetrieveAPIView):
    serializer_class = ImportJobSerializer
    queryset = ImportJob.objects.select_related("contact_list")


class _IssuesView(generics.ListAPIView):
    serializer_class = ImportIssueSerializer
    pagination_class = LineCursorPagination
    kind = ImportIssue.Kind.REJECTED

    def get_queryset(self) -> QuerySet[ImportIssue]:
        job = get_object_or_404(ImportJob, pk=self.kwargs["pk"])
        return ImportIssue.objects.filter(job=job, kind=self.kind)


@extend_schema(description="Every rejected row of the import, in line order (cursor pagination).")
class ImportRejectionsView(_IssuesView):
    kind = ImportIssue.Kind.REJECTED


@extend_schema(description="Every row merged into an earlier row with the same address, in line order.")
class ImportDuplicatesView(_IssuesView):
    kind = ImportIssue.Kind.DUPLICATE


class ImportRejectionsCsvView(APIView):
    content_negotiation_class = IgnoreAccept  # `Accept: text/csv` was a 406 (core.api_negotiation)

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request: Request, pk: int, *args: Any) -> StreamingHttpResponse:
        """Every rejected row as CSV (line, reason, excerpt), streamed."""
        job = get_object_or_404(ImportJob, pk=pk)
        response = StreamingHttpResponse(
            import_jobs.rejections_csv(job), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="import-{job.pk}-rejected.csv"'
        return response


urlpatterns = [
    path("imports/<int:pk>", ImportJobDetailView.as_view(), name="import-detail"),
    path("imports/<int:pk>/rejections", ImportRejectionsView.as_view(), name="import-rejections"),
    path("imports/<int:pk>/rejections.csv", ImportRejectionsCsvView.as_view(), name="import-rejections-csv"),
    path("imports/<int:pk>/duplicates", ImportDuplicatesView.as_view(), name="import-duplicates"),
]
