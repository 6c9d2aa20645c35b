"""Contacts, lists, suppressions and CSV import (routes in `urlpatterns`).

Validation lives in the serializers (a 400 names the field, before anything is written); writes
beyond a plain save() are services (campaigns.services, campaigns.importing).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.parsers import FileUploadParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns.api.imports import ImportJobSerializer
from campaigns.erasure import erase_contacts
from campaigns.exceptions import Conflict, ImportFileError, ImportTooLarge, ListInUse
from campaigns.import_jobs import create_import_job
from campaigns.models import Contact, ContactList, ImportJob, Suppression
from campaigns.services import add_list_members, delete_contact_list, remove_list_members
from core import api_input, limits
from core.api_schema import EmailAddressField, error_response
from core.validators import ONE_LINE

MAX_MEMBER_IDS = 10_000  # per request; larger sets go through the CSV import


def _address(value: str) -> str:
    email = value.strip().lower()
    try:
        validate_email(email)
    except DjangoValidationError:
        raise serializers.ValidationError(f"{value!r} is not a valid email address") from None
    return email


class ContactSerializer(api_input.ModelSerializer):
    # Declared, so the uniqueness check runs on the lower-cased address (see validate_email).
    email = EmailAddressField(max_length=254)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, validators=[ONE_LINE])
    attributes = api_input.JSONObjectField(
        required=False, limits=(limits.ATTRIBUTES_KEYS, limits.ATTRIBUTES_BYTES)
    )

    class Meta:
        model = Contact
        fields = ["id", "email", "name", "timezone", "attributes", "status", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_email(self, value: str) -> str:
        email = _address(value)
        others = Contact.objects.filter(email=email)
        if self.instance is not None:
            others = others.exclude(pk=self.instance.pk)
        existing = others.values_list("pk", flat=True).first()
        if existing is not None:
            raise serializers.ValidationError(f"contact {existing} has the address {email} already")
        return email


class ContactFilterSerializer(api_input.QueryParameters):
    # An exact address in any case; a value that is no address matches nothing (not `format:
    # email`, which would call such a query invalid while it is answered).
    email = serializers.CharField(max_length=254, required=False, help_text="an exact address, any case")
    list = serializers.IntegerField(required=False, min_value=1, help_text="a list id")
    status = serializers.ChoiceField(choices=Contact.Status.choices, required=False)


class ContactListSerializer(api_input.ModelSerializer):
    member_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = ContactList
        fields = ["id", "name", "description", "member_count", "created_at"]
        read_only_fields = ["id", "created_at"]


class MembersSerializer(api_input.Serializer):
    contact_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        allow_empty=False,
        min_length=1,
        max_length=MAX_MEMBER_IDS,
    )


class AddMembersSerializer(MembersSerializer):
    def validate_contact_ids(self, value: list[int]) -> list[int]:
        wanted = set(value)
        missing = wanted - set(Contact.objects.filter(pk__in=wanted).values_list("pk", flat=True))
        if missing:
            raise serializers.ValidationError(
                f"no contacts with ids {sorted(missing)[:20]}; nothing was added"
            )
        return sorted(wanted)


class MembersResultSerializer(api_input.Serializer):
    added = serializers.IntegerField(required=False)
    removed = serializers.IntegerField(required=False)
    member_count = serializers.IntegerField()


class SuppressionSerializer(api_input.ModelSerializer):
    email = EmailAddressField(max_length=254)
    detail = serializers.CharField(max_length=2000, required=False, allow_blank=True)

    class Meta:
        model = Suppression
        fields = ["id", "email", "reason", "detail", "created_at"]
        read_only_fields = ["id", "created_at"]

    def validate_email(self, value: str) -> str:
        email = _address(value)
        existing = Suppression.objects.filter(email=email).first()
        if existing is not None:
            raise serializers.ValidationError(
                f"{email} is suppressed already (suppression {existing.pk}, {existing.reason}); "
                "delete it first to record another reason"
            )
        return email


class SuppressionFilterSerializer(api_input.QueryParameters):
    email = serializers.CharField(max_length=254, required=False, help_text="an exact address, any case")
    reason = serializers.ChoiceField(choices=Suppression.Reason.choices, required=False)


_NO_FILE = "send the CSV in the multipart field `file`, or as the request body with Content-Type: text/csv"


class ImportUploadSerializer(api_input.Serializer):
    file = serializers.FileField(
        help_text="UTF-8 CSV; header row with an email column",
        error_messages={"required": _NO_FILE, "null": _NO_FILE},
    )
    list = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="list name; created if missing (also a query parameter)",
    )


def _filtered(request: Request, filter_class: type[serializers.Serializer]) -> dict[str, Any]:
    filters = filter_class(data=request.query_params)
    filters.is_valid(raise_exception=True)
    return filters.validated_data


def _save_contact(serializer: serializers.BaseSerializer) -> None:
    try:
        with transaction.atomic():
            serializer.save()
    except IntegrityError:  # another request took the address between validation and save
        raise serializers.ValidationError({"email": ["a contact has this address already"]}) from None


@extend_schema_view(get=extend_schema(parameters=[ContactFilterSerializer]))
class ContactListCreateView(generics.ListCreateAPIView):
    serializer_class = ContactSerializer

    def get_queryset(self) -> QuerySet[Contact]:
        contacts = Contact.objects.all()
        if self.request.method != "GET":
            return contacts
        filters = _filtered(self.request, ContactFilterSerializer)
        if "email" in filters:
            contacts = contacts.filter(email=filters["email"].strip().lower())
        if "list" in filters:
            contacts = contacts.filter(listmembership__contact_list_id=filters["list"])
        if "status" in filters:
            contacts = contacts.filter(status=filters["status"])
        return contacts

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        _save_contact(serializer)


class ContactDetailView(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = ContactSerializer
    queryset = Contact.objects.all()
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        _save_contact(serializer)

    @extend_schema(
        responses={204: None},
        description=(
            "Erase the contact: the row is anonymised, never removed (its address becomes "
            "`erased-<id>@invalid`, name and attributes are cleared, list memberships removed; "
            "messages sent to it keep their status and timestamps with the placeholder address)."
        ),
    )
    def delete(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().delete(request, *args, **kwargs)

    def perform_destroy(self, instance: Contact) -> None:
        erase_contacts([instance.pk])


class CsvBodyParser(FileUploadParser):
    """A `text/csv` request body, received like a file upload (spooled to disk when large)."""

    media_type = "text/csv"

    def get_filename(self, stream: Any, media_type: Any, parser_context: Any) -> str:
        return super().get_filename(stream, media_type, parser_context) or "contacts.csv"


class ContactImportView(APIView):
    parser_classes = [MultiPartParser, CsvBodyParser]

    @extend_schema(
        request={"multipart/form-data": ImportUploadSerializer, "text/csv": OpenApiTypes.BINARY},
        parameters=[OpenApiParameter("list", str, description="list name; created if missing")],
        responses={
            202: ImportJobSerializer,
            413: error_response(413, "the file is larger than EMAILHUB_IMPORT_MAX_BYTES"),
        },
        description=(
            "Store a CSV of contacts and import it as a job: 202 with the job and its Location "
            "(`GET /api/v1/imports/{id}`). A bad header is a 400 here, before anything is stored; "
            "bad rows are rejected one by one with their line and reason, duplicates merged "
            "(later row wins). Files up to EMAILHUB_IMPORT_MAX_BYTES (413 beyond)."
        ),
    )
    def post(self, request: Request) -> Response:
        limit = settings.EMAILHUB_IMPORT_MAX_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit + 64 * 1024:  # refused before the upload is read (multipart framing aside)
            raise ImportTooLarge(limit)
        data = {"file": request.data.get("file")}
        list_name = request.query_params.get("list", request.data.get("list"))
        if list_name is not None:
            data["list"] = list_name
        upload = ImportUploadSerializer(data=data)
        upload.is_valid(raise_exception=True)
        file = upload.validated_data["file"]
        if file.size > limit:
            raise ImportTooLarge(limit)
        try:
            job = create_import_job(
                file,
                filename=file.name or "",
                list_name=(upload.validated_data.get("list") or "").strip() or None,
            )
        except ImportFileError as exc:
            raise serializers.ValidationError({"file": [str(exc)]}) from None
        body = ImportJobSerializer(job, context={"request": request}).data
        return Response(
            body, status=status.HTTP_202_ACCEPTED, headers={"Location": body_location(request, job)}
        )


def body_location(request: Request, job: ImportJob) -> str:
    return request.build_absolute_uri(reverse("import-detail", kwargs={"pk": job.pk}))


def _lists() -> QuerySet[ContactList]:
    return ContactList.objects.annotate(member_count=Count("listmembership"))


class ContactListsView(generics.ListCreateAPIView):
    serializer_class = ContactListSerializer

    def get_queryset(self) -> QuerySet[ContactList]:
        return _lists()

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.save().member_count = 0


class ContactListDetailView(generics.RetrieveUpdateDestroyAPIView):
    serializer_class = ContactListSerializer
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[ContactList]:
        return _lists()

    @extend_schema(responses={204: None, 409: error_response(409, "a campaign uses this list")})
    def delete(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().delete(request, *args, **kwargs)

    def perform_destroy(self, instance: ContactList) -> None:
        try:
            delete_contact_list(instance)
        except ListInUse as exc:
            raise Conflict(str(exc)) from None


class ListMembersView(APIView):
    """Add or remove contacts by id, in one statement each way; the contacts themselves stay."""

    delete_takes_body = True  # DELETE reads `contact_ids` (core.api_schema)

    @extend_schema(request=AddMembersSerializer, responses={200: MembersResultSerializer})
    def post(self, request: Request, pk: int) -> Response:
        contact_list = get_object_or_404(ContactList, pk=pk)
        members = AddMembersSerializer(data=request.data)
        members.is_valid(raise_exception=True)
        added = add_list_members(contact_list, members.validated_data["contact_ids"])
        return Response({"added": added, "member_count": contact_list.listmembership_set.count()})

    @extend_schema(request=MembersSerializer, responses={200: MembersResultSerializer})
    def delete(self, request: Request, pk: int) -> Response:
        contact_list = get_object_or_404(ContactList, pk=pk)
        members = MembersSerializer(data=request.data)
        members.is_valid(raise_exception=True)
        removed = remove_list_members(contact_list, members.validated_data["contact_ids"])
        return Response({"removed": removed, "member_count": contact_list.listmembership_set.count()})


@extend_schema_view(get=extend_schema(parameters=[SuppressionFilterSerializer]))
class SuppressionsView(generics.ListCreateAPIView):
    serializer_class = SuppressionSerializer

    def get_queryset(self) -> QuerySet[Suppression]:
        suppressions = Suppression.objects.all()
        if self.request.method != "GET":
            return suppressions
        filters = _filtered(self.request, SuppressionFilterSerializer)
        if "email" in filters:
            suppressions = suppressions.filter(email=filters["email"].strip().lower())
        if "reason" in filters:
            suppressions = suppressions.filter(reason=filters["reason"])
        return suppressions

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        try:
            with transaction.atomic():
                serializer.save()
        except IntegrityError:  # suppressed by a send or another request since validation
            raise serializers.ValidationError({"email": ["this address is suppressed already"]}) from None


class SuppressionDetailView(generics.RetrieveDestroyAPIView):
    serializer_class = SuppressionSerializer
    queryset = Suppression.objects.all()


urlpatterns = [
    path("contacts", ContactListCreateView.as_view(), name="contact-list"),
    path("contacts/import", ContactImportView.as_view(), name="contact-import"),
    path("contacts/<int:pk>", ContactDetailView.as_view(), name="contact-detail"),
    path("lists", ContactListsView.as_view(), name="list-list"),
    path("lists/<int:pk>", ContactListDetailView.as_view(), name="list-detail"),
    path("lists/<int:pk>/members", ListMembersView.as_view(), name="list-members"),
    path("suppressions", SuppressionsView.as_view(), name="suppression-list"),
    path("suppressions/<int:pk>", SuppressionDetailView.as_view(), name="suppression-detail"),
]
