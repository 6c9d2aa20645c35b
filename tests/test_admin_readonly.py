"""The admin never writes state a worker writes: forms are read-only there, operators act through
actions that call the conditional-UPDATE services (issue 8, items 2 and 3)."""

from __future__ import annotations

from datetime import timedelta
from html.parser import HTMLParser

import pytest
import redis as redis_lib
from django.db.models.signals import pre_save
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from campaigns import lifecycle
from campaigns.models import Campaign, Contact, ContactList, Suppression, Template
from core import schedule_index
from core.models import OutboxTask
from delivery.models import Message, MessageStatus
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from scheduling import dispatch
from scheduling.models import RecurringSchedule, ScheduleOccurrence
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


class _FormFields(HTMLParser):
    """The values a browser would submit from the page's forms: what "Save on the unchanged
    page" sends."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str | list[str]] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                return
            self.fields[name] = a.get("value", "on" if a.get("type") == "checkbox" else "")
        elif tag == "select" and name:
            self._select = name
            self.fields.setdefault(name, "")
        elif tag == "option" and self._select and "selected" in a:
            self.fields[self._select] = a.get("value", "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.fields[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.fields[self._textarea] = str(self.fields[self._textarea]) + data.lstrip("\n")


def form_of(page: str) -> dict[str, str | list[str]]:
    parser = _FormFields()
    parser.feed(page)
    return parser.fields


def change_url(obj: object) -> str:
    meta = obj._meta  # type: ignore[attr-defined]
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])  # type: ignore[attr-defined]


def changelist(model: type) -> str:  # a model class
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")  # type: ignore[attr-defined]


def page_messages(response: object) -> str:
    return " | ".join(str(m) for m in response.context["messages"])  # type: ignore[attr-defined]


def campaign(status: str = "sending", name: str = "c", **fields: object) -> Campaign:
    return factories.campaign(name, status=status, **fields)


# Item 2: messages


def test_save_on_an_open_retry_wait_page_after_the_worker_sent_it_changes_nothing(
    admin_client: Client, smtp: SMTPTestServer, redis: redis_lib.Redis
) -> None:
    due = timezone.now() - timedelta(seconds=1)
    message = Message.objects.create(
        to_email="ann@example.com", subject="Hi", text="hello", priority="high",
        status=MessageStatus.RETRY_WAIT, due_at=due, attempts=1, last_error="smtp: 451 try later",
    )  # fmt: skip
    schedule_index.add([(schedule_index.message_unit(message.pk), due)])
    page = admin_client.get(change_url(message))
    assert page.status_code == 200
    form = form_of(page.content.decode())

    # The scheduler dispatches the retry and a worker sends it while the page is open.
    claim = schedule_index.claim(100, 30)
    assert dispatch.dispatch(claim.units) == 1
    schedule_index.ack(claim)
    assert send_messages([message.pk]).sent == 1
    sent = Message.objects.get(pk=message.pk)
    assert sent.status == "sent" and len(smtp.wait_for(1)) == 1

    response = admin_client.post(change_url(message), {**form, "_save": "Save"})
    after = Message.objects.get(pk=message.pk)
    assert after.status == "sent", f"Save put the sent message back in {after.status}"
    assert response.status_code == 403
    assert (after.status, after.due_at, after.attempts, after.sent_at, after.to_email) == (
        "sent", sent.due_at, sent.attempts, sent.sent_at, "ann@example.com",
    )  # fmt: skip
    # Nothing could send it again: no unit in the schedule index, no task waiting in the outbox.
    assert redis.zcard(schedule_index.DUE) == 0 and not OutboxTask.objects.exists()
    assert send_messages([message.pk]).claimed == 0 and smtp.count == 1


def test_message_and_outbox_pages_show_fields_with_no_add_save_or_delete(admin_client: Client) -> None:
    message = Message.objects.create(to_email="ann@example.com", subject="Hi", text="hello", priority="high")
    event = OutboxTask.objects.create(kind="send_messages", payload={"ids": [message.pk], "priority": "high"})
    for obj in (message, event):
        page = admin_client.get(change_url(obj)).content.decode()
        assert "ann@example.com" in page or "send_messages" in page
        assert 'name="_save"' not in page and 'name="_continue"' not in page
        meta = obj._meta
        assert admin_client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_add")).status_code == 403
        delete = reverse(f"admin:{meta.app_label}_{meta.model_name}_delete", args=[obj.pk])
        assert admin_client.post(delete, {"post": "yes"}).status_code == 403
        assert admin_client.post(
            changelist(type(obj)), {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"}
        ).status_code in (200, 302)
    assert Message.objects.filter(pk=message.pk, status="queued").exists()
    assert OutboxTask.objects.filter(pk=event.pk).exists()


def test_retry_failed_requeues_with_attempts_reset_and_skips_suppressed_and_moved_rows(
    admin_client: Client, smtp: SMTPTestServer
) -> None:
    failed = Message.objects.create(
        to_email="ann@example.com", subject="Hi", text="hello", priority="high",
        status=MessageStatus.FAILED, attempts=8, last_error="smtp: 421",
    )  # fmt: skip
    suppressed = Message.objects.create(
        to_email="Bob@example.com", subject="Hi", text="hello", priority="high", status=MessageStatus.FAILED
    )
    Suppression.objects.create(email="bob@example.com", reason="bounced")
    running = campaign("sending", total_count=1, failed_count=1)
    contact = Contact.objects.create(email="cy@example.com")
    in_campaign = Message.objects.create(
        to_email="cy@example.com", campaign=running, contact=contact, template=running.template,
        priority="normal", status=MessageStatus.FAILED, attempts=8,
    )  # fmt: skip
    # Shown as failed on the operator's page, sent by someone else's retry since.
    moved = Message.objects.create(
        to_email="dee@example.com", subject="Hi", text="hello", priority="high", status=MessageStatus.SENT
    )
    ids = [failed.pk, suppressed.pk, in_campaign.pk, moved.pk]
    response = admin_client.post(
        changelist(Message), {"action": "retry_failed_messages", "_selected_action": ids}, follow=True
    )
    report = page_messages(response)
    assert "requeued 2 message(s)" in report
    assert f"message {suppressed.pk} skipped: the address is on the suppression list" in report
    assert f"message {moved.pk} skipped: it is sent now, not failed" in report
    assert Message.objects.get(pk=failed.pk).status == "queued"
    assert Message.objects.get(pk=failed.pk).attempts == 0
    assert Message.objects.get(pk=suppressed.pk).status == "failed"
    assert Message.objects.get(pk=moved.pk).status == "sent"
    running.refresh_from_db()
    assert running.failed_count == 0  # unfinished again, counted again when it finishes

    send_messages([failed.pk, in_campaign.pk])
    assert sorted(m.rcpt_tos[0] for m in smtp.wait_for(2)) == ["ann@example.com", "cy@example.com"]
    running.refresh_from_db()
    assert (running.sent_count, running.failed_count, running.status) == (1, 0, "sending")


def test_retry_refuses_a_finished_campaigns_message_that_no_worker_would_claim(admin_client: Client) -> None:
    done = campaign("completed", total_count=1, failed_count=1, fanout_done=True)
    message = Message.objects.create(
        to_email="cy@example.com", campaign=done, template=done.template, priority="normal", status="failed"
    )
    response = admin_client.post(
        changelist(Message),
        {"action": "retry_failed_messages", "_selected_action": [message.pk]},
        follow=True,
    )
    assert "its campaign is completed" in page_messages(response)
    assert Message.objects.get(pk=message.pk).status == "failed"
    assert Campaign.objects.get(pk=done.pk).failed_count == 1


def test_cancel_moves_campaign_counters_and_drops_schedule_units(
    admin_client: Client, redis: redis_lib.Redis
) -> None:
    later = timezone.now() + timedelta(hours=1)
    scheduled = Message.objects.create(
        to_email="ann@example.com", subject="Hi", text="x", priority="high", status="scheduled", due_at=later
    )
    schedule_index.add([(schedule_index.message_unit(scheduled.pk), later)])
    running = campaign("sending", total_count=2, sent_count=1, fanout_done=True)
    queued = Message.objects.create(
        to_email="bob@example.com",
        campaign=running,
        template=running.template,
        priority="normal",
        status="queued",
    )
    sent = Message.objects.create(
        to_email="cy@example.com", subject="Hi", text="x", priority="high", status="sent"
    )
    response = admin_client.post(
        changelist(Message),
        {"action": "cancel_messages", "_selected_action": [scheduled.pk, queued.pk, sent.pk]},
        follow=True,
    )
    report = page_messages(response)
    assert "cancelled 2 message(s)" in report
    assert f"message {sent.pk} skipped: it is sent now, not cancellable" in report
    assert Message.objects.get(pk=scheduled.pk).status == "cancelled"
    assert Message.objects.get(pk=queued.pk).status == "cancelled"
    assert Message.objects.get(pk=sent.pk).status == "sent"
    assert redis.zscore(schedule_index.DUE, schedule_index.message_unit(scheduled.pk)) is None
    running.refresh_from_db()
    # The last unfinished message was cancelled, so the campaign completes, in the same statement.
    assert (running.cancelled_count, running.status) == (1, "completed")


def test_staff_with_view_permission_only_gets_no_actions(db: None) -> None:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_message"))
    client = Client()
    client.force_login(user)
    page = client.get(changelist(Message)).content.decode()
    assert "retry_failed_messages" not in page and "cancel_messages" not in page


# Item 2: every other form that shows state a worker writes


def test_a_started_campaigns_form_saves_only_its_name_and_a_drafts_goes_through_update_draft(
    admin_client: Client,
) -> None:
    running = campaign("sending", sent_count=3)
    form = form_of(admin_client.get(change_url(running)).content.decode())
    Campaign.objects.filter(pk=running.pk).update(sent_count=7, status="paused")  # workers, an operator
    response = admin_client.post(
        change_url(running), {**form, "name": "renamed", "from_email": "x@example.com", "priority": "low"}
    )
    assert response.status_code == 302
    running.refresh_from_db()
    assert (running.name, running.from_email, running.priority, running.sent_count, running.status) == (
        "renamed", "", "normal", 7, "paused",
    )  # fmt: skip

    draft = campaign("draft")
    other = Template.objects.create(name="other", subject="s2", text="y")
    form = form_of(admin_client.get(change_url(draft)).content.decode())
    response = admin_client.post(change_url(draft), {**form, "template": str(other.pk), "priority": "low"})
    assert response.status_code == 302
    draft.refresh_from_db()
    assert (draft.template_id, draft.priority, draft.status) == (other.pk, "low", "draft")


def test_a_drafts_form_save_goes_through_update_draft_which_refuses_a_draft_scheduled_meanwhile(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = campaign("draft")
    original = draft.template_id
    other = Template.objects.create(name="other", subject="s2", text="y")
    form = form_of(admin_client.get(change_url(draft)).content.decode())
    calls: list[tuple[int, dict[str, object]]] = []
    update_draft = lifecycle.update_draft

    def scheduled_first(campaign_id: int, changes: dict[str, object]) -> Campaign:
        # Another operator schedules it after the admin read it as a draft, before the save.
        calls.append((campaign_id, dict(changes)))
        Campaign.objects.filter(pk=campaign_id).update(status="scheduled")
        return update_draft(campaign_id, changes)

    monkeypatch.setattr(lifecycle, "update_draft", scheduled_first)
    response = admin_client.post(
        change_url(draft), {**form, "template": str(other.pk), "priority": "low"}, follow=True
    )
    assert response.status_code == 200
    assert calls == [(draft.pk, {"template": other, "priority": "low"})]
    assert "not saved" in page_messages(response)
    draft.refresh_from_db()
    assert (draft.template_id, draft.priority, draft.status) == (original, "normal", "scheduled")


def test_contact_status_written_by_a_bounce_survives_a_save_of_the_open_page(admin_client: Client) -> None:
    contact = Contact.objects.create(email="ann@example.com", name="Ann")
    form = form_of(admin_client.get(change_url(contact)).content.decode())
    Contact.objects.filter(pk=contact.pk).update(status="bounced")  # a bounce webhook meanwhile
    response = admin_client.post(change_url(contact), {**form, "name": "Ann B"})
    assert response.status_code == 302
    contact.refresh_from_db()
    assert (contact.name, contact.status) == ("Ann B", "bounced")


def test_recurring_schedule_save_keeps_the_beats_due_occurrence(admin_client: Client) -> None:
    template = Template.objects.create(name="t", subject="s", text="x")
    due = (timezone.now() - timedelta(minutes=1)).replace(microsecond=0)
    recurring = RecurringSchedule.objects.create(
        name="daily", cron="0 9 * * *", timezone="UTC", template=template,
        contact_list=ContactList.objects.create(name="l"), next_run=due, last_run=due - timedelta(days=1),
    )  # fmt: skip
    form = form_of(admin_client.get(change_url(recurring)).content.decode())
    response = admin_client.post(change_url(recurring), {**form, "name": "daily digest"})
    assert response.status_code == 302
    recurring.refresh_from_db()
    # The beat still fires the occurrence that was due; a rename does not skip it.
    assert (recurring.name, recurring.next_run, recurring.last_run) == (
        "daily digest",
        due,
        due - timedelta(days=1),
    )

    response = admin_client.post(change_url(recurring), {**form, "cron": "0 10 * * *"})
    recurring.refresh_from_db()
    assert recurring.next_run is not None and recurring.next_run > timezone.now()


def test_schedule_occurrences_are_never_edited_or_deleted(admin_client: Client) -> None:
    template = Template.objects.create(name="t", subject="s", text="x")
    contact_list = ContactList.objects.create(name="l")
    recurring = RecurringSchedule.objects.create(
        name="daily", cron="0 9 * * *", template=template, contact_list=contact_list
    )
    fired = campaign("completed")
    occurrence = ScheduleOccurrence.objects.create(
        schedule=recurring, occurrence=timezone.now(), campaign=fired
    )
    delete = reverse("admin:scheduling_scheduleoccurrence_delete", args=[occurrence.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert 'name="_save"' not in admin_client.get(change_url(occurrence)).content.decode()
    assert ScheduleOccurrence.objects.filter(pk=occurrence.pk).exists()


def test_disabling_a_periodic_task_never_writes_its_run_count(admin_client: Client) -> None:
    from django_celery_beat.models import PeriodicTask

    from emailhub.periodic import ensure_periodic_tasks

    ensure_periodic_tasks()
    task = PeriodicTask.objects.get(name="emailhub: relay outbox")
    form = form_of(admin_client.get(change_url(task)).content.decode())
    form.pop("enabled", None)  # unticked

    def beat_runs_it(sender: type, instance: PeriodicTask, **kwargs: object) -> None:
        # The beat records a run after the admin loaded the row and before it saves it.
        PeriodicTask.objects.filter(pk=instance.pk).update(total_run_count=41)

    pre_save.connect(beat_runs_it, sender=PeriodicTask)
    try:
        response = admin_client.post(change_url(task), {**form, "_save": "Save"})
    finally:
        pre_save.disconnect(beat_runs_it, sender=PeriodicTask)
    assert response.status_code == 302, response.content.decode()[:3000]
    task.refresh_from_db()
    assert (task.enabled, task.total_run_count) == (False, 41)


# Item 3: campaigns with history are archived, never deleted


def test_a_campaign_with_messages_cannot_be_deleted_and_its_page_lists_no_messages(
    admin_client: Client,
) -> None:
    done = campaign("completed", total_count=3, sent_count=3, fanout_done=True)
    for n in range(3):
        Message.objects.create(
            to_email=f"user{n}@example.com",
            campaign=done,
            template=done.template,
            priority="normal",
            status="sent",
        )
    delete = reverse("admin:campaigns_campaign_delete", args=[done.pk])
    page = admin_client.get(delete).content.decode()
    assert "only a draft with no messages is deleted; cancel and archive it instead" in page
    assert "user0@example.com" not in page
    admin_client.post(delete, {"post": "yes"})
    response = admin_client.post(
        changelist(Campaign), {"action": "delete_selected", "_selected_action": [done.pk], "post": "yes"}
    )
    assert (
        "archive it instead" in response.content.decode()
        and "user1@example.com" not in response.content.decode()
    )
    assert Campaign.objects.filter(pk=done.pk).exists()
    assert Message.objects.filter(campaign=done).count() == 3


def test_a_sending_campaign_cannot_be_deleted_even_before_its_first_message(admin_client: Client) -> None:
    running = campaign("sending")
    admin_client.post(reverse("admin:campaigns_campaign_delete", args=[running.pk]), {"post": "yes"})
    assert Campaign.objects.filter(pk=running.pk).exists()


def test_a_draft_with_no_messages_can_be_deleted(admin_client: Client) -> None:
    draft = campaign("draft")
    response = admin_client.post(reverse("admin:campaigns_campaign_delete", args=[draft.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not Campaign.objects.filter(pk=draft.pk).exists()


def test_archive_hides_finished_campaigns_from_the_default_list_and_refuses_running_ones(
    admin_client: Client,
) -> None:
    done = campaign("completed", name="finished-one")
    running = campaign("sending", name="running-one")
    response = admin_client.post(
        changelist(Campaign), {"action": "archive", "_selected_action": [done.pk, running.pk]}, follow=True
    )
    assert (
        "only a completed, cancelled or failed campaign can be archived; this one is sending (cancel it first)"
        in (page_messages(response))
    )
    assert Campaign.objects.get(pk=done.pk).archived_at is not None
    assert Campaign.objects.get(pk=running.pk).archived_at is None
    default = admin_client.get(changelist(Campaign)).content.decode()
    assert "running-one" in default and "finished-one" not in default
    archived = admin_client.get(changelist(Campaign), {"archived": "yes"}).content.decode()
    assert "finished-one" in archived and "running-one" not in archived
