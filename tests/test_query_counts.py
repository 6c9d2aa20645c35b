"""The statements the hot paths send to PostgreSQL, pinned exactly, and the same at any size.

docs/performance.md and docs/architecture.md promise what each hot path costs in round trips:
one statement for an accepted message and its outbox row plus the DELETE, one claim per batch,
one UPDATE per outcome, a fan-out step of set-based SQL. Each test below captures the statements
of one call (Django's CaptureQueriesContext, which also sees BEGIN, SAVEPOINT and COMMIT), pins
their shapes, and runs the call at a small and a large size: a statement per row or per
recipient would show as a longer list. `transaction=True`: the paths commit for real, and what
they send after commit (the outbox's publish and DELETE) is part of the cost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from campaigns import fanout
from campaigns.selectors import AUDIENCE_TABLES
from core import statistics
from core.sql import PREPARED, execute_prepared
from delivery.models import Message
from delivery.providers import locmem
from delivery.services.sending import send_messages
from delivery.services.transitions import claim
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def shape(sql: str) -> str:
    """A statement in a few words: the tables it writes, else the table (or function) it reads,
    else its first word (BEGIN, COMMIT, SAVEPOINT, RELEASE)."""
    sql = " ".join(sql.replace('"', "").split())
    # A prepared statement (core.sql.execute_prepared) is described by what it runs.
    executed = re.match(r"(?:PREPARE \w+ AS .*; )?EXECUTE (emailhub_\w+)", sql)
    if executed:
        sql = " ".join(PREPARED[executed[1]].split())
    writes = re.findall(r"(?<!FOR )\b(INSERT INTO|UPDATE|DELETE FROM) (\w+)", sql)
    # A statement that moves messages also writes their outbound events (core.outbound_events),
    # a CTE of the same statement: no round trip of its own, so not a shape of its own either.
    writes = [write for write in writes if write != ("INSERT INTO", "core_outboundevent")]
    if writes:
        return " + ".join(f"{verb} {table}" for verb, table in writes)
    if sql.startswith("SELECT"):
        table = re.search(r"\bFROM (\w+)", sql)
        return f"SELECT FROM {table[1]}" if table else sql.split("(")[0]
    return sql.split()[0]


def statements(call: Callable[[], Any]) -> list[str]:
    """The shapes of the statements `call` sends on this thread's connection, in order."""
    with CaptureQueriesContext(connection) as captured:
        call()
    return [shape(query["sql"]) for query in captured.captured_queries]


# --- accepting messages (POST /api/v1/messages, /api/v1/messages/batch) ---------------------------

ACCEPT_ONE = [
    # core.outbox.insert_with_task: the message row and its outbox row in one statement, in
    # autocommit (no BEGIN or COMMIT), so on_commit publishes right after it.
    "INSERT INTO delivery_message + INSERT INTO core_outboxtask",
    # The published outbox row deleted (with synchronous_commit off).
    "DELETE FROM core_outboxtask",
]

ACCEPT_BATCH = [
    "BEGIN",
    "INSERT INTO delivery_message",  # every item: one INSERT … SELECT FROM unnest(…)
    "INSERT INTO core_outboxtask",  # every send task (one per 100 normal ids): one INSERT
    "COMMIT",
    "DELETE FROM core_outboxtask",  # every published task's row: one DELETE
]


def warmed(api: APIClient) -> APIClient:
    """The API key looked up once: later requests find it in the process's key cache
    (EMAILHUB_API_KEY_CACHE_SECONDS), as a busy web worker does."""
    assert api.post("/api/v1/messages", factories.message_body(0), format="json").status_code == 202
    return api


@pytest.mark.usefixtures("fast_paths")
def test_accepting_one_message_is_one_statement_and_the_outbox_delete(api: APIClient) -> None:
    """POST /api/v1/messages with the key cached: 2 statements, both fast-path settings. The
    `WITH inserted AS (INSERT INTO delivery_message …), event AS (INSERT INTO
    core_outboxtask …)` statement in autocommit, then, after the publish, the DELETE of the
    outbox row (ACCEPT_ONE)."""
    api = warmed(api)

    def accept() -> None:
        assert api.post("/api/v1/messages", factories.message_body(1), format="json").status_code == 202

    assert statements(accept) == ACCEPT_ONE


@pytest.mark.parametrize("prepared", [True, False])
def test_the_accept_statement_is_prepared_once_per_connection_or_sent_as_it_is(
    api: APIClient,
    settings,
    prepared: bool,  # noqa: ANN001
) -> None:
    """core.sql.execute_prepared: on a new connection `PREPARE …; EXECUTE …` in one round trip,
    then `EXECUTE` alone; with EMAILHUB_PREPARED_STATEMENTS off, the statement itself each time.
    Either way the shapes are ACCEPT_ONE and the message is stored."""
    settings.EMAILHUB_PREPARED_STATEMENTS = prepared
    api = warmed(api)
    connection.close()  # a new connection: nothing prepared on it yet
    sent: list[str] = []
    for n in range(3):
        with CaptureQueriesContext(connection) as captured:
            assert api.post("/api/v1/messages", factories.message_body(n), format="json").status_code == 202
        assert [shape(q["sql"]) for q in captured.captured_queries] == ACCEPT_ONE
        sent.append(captured.captured_queries[0]["sql"].split()[0])
    assert sent == (["PREPARE", "EXECUTE", "EXECUTE"] if prepared else ["WITH"] * 3)
    assert Message.objects.count() == 1 + 3  # warmed() sent one


@pytest.mark.usefixtures("fast_paths")
def test_accepting_a_batch_takes_the_same_five_statements_for_10_or_200_messages(api: APIClient) -> None:
    """POST /api/v1/messages/batch: 5 statements for 10 or 200 `normal` messages (1 or 2 send
    tasks). BEGIN, one INSERT … SELECT FROM unnest for every row, one INSERT of the outbox rows,
    COMMIT, one DELETE of the published rows (ACCEPT_BATCH)."""
    api = warmed(api)

    def accept(size: int) -> list[str]:
        items = [factories.message_body(n, priority="normal") for n in range(size)]

        def post() -> None:
            response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
            assert response.status_code == 202 and response.json()["accepted"] == size

        return statements(post)

    assert accept(10) == accept(200) == ACCEPT_BATCH


ACCEPT_ONE_WITH_ATTACHMENTS = [
    "BEGIN",  # the contents and the row that names them commit together
    "INSERT INTO delivery_attachmentcontent",  # each distinct content, ON CONFLICT DO NOTHING
    "INSERT INTO delivery_message + INSERT INTO core_outboxtask",
    "COMMIT",
    "DELETE FROM core_outboxtask",
]


def with_pdf(n: int, **fields: Any) -> dict[str, Any]:
    pdf = {"filename": "receipt.pdf", "content_type": "application/pdf", "content": "JVBERi0xLjQK"}
    return factories.message_body(n, attachments=[pdf], **fields)


@pytest.mark.usefixtures("fast_paths")
def test_accepting_one_message_with_attachments_adds_one_insert_in_its_transaction(api: APIClient) -> None:
    """POST /api/v1/messages with an attachment: its content's INSERT joins the message's
    statement in one transaction (ACCEPT_ONE_WITH_ATTACHMENTS)."""
    api = warmed(api)

    def accept() -> None:
        assert api.post("/api/v1/messages", with_pdf(1), format="json").status_code == 202

    assert statements(accept) == ACCEPT_ONE_WITH_ATTACHMENTS


@pytest.mark.usefixtures("fast_paths")
def test_a_batch_with_attachments_adds_one_insert_for_10_or_200_messages(api: APIClient) -> None:
    """POST /api/v1/messages/batch where every item attaches the same file: one INSERT of the
    distinct contents, whatever the number of items."""
    api = warmed(api)

    def accept(size: int) -> list[str]:
        items = [with_pdf(n, priority="normal") for n in range(size)]
        return statements(lambda: api.post("/api/v1/messages/batch", {"messages": items}, format="json"))

    expected = [*ACCEPT_BATCH[:1], "INSERT INTO delivery_attachmentcontent", *ACCEPT_BATCH[1:]]
    assert accept(10) == accept(200) == expected


# --- sending a batch: the claim and the record ----------------------------------------------------


def test_a_claim_is_one_update_for_1_or_50_messages() -> None:
    """transitions.claim: 1 statement, the conditional UPDATE … RETURNING, for 1 or 50 ids."""

    def claimed(size: int) -> list[str]:
        ids = [message.pk for message in factories.messages(size, prefix=f"c{size}-")]

        def claim_all() -> None:
            assert len(claim(ids)) == size

        return statements(claim_all)

    # UPDATE … SET status='sending' … WHERE id = ANY(ids) AND status='queued' RETURNING …, the
    # suppression check and the campaign's status folded in.
    assert claimed(1) == claimed(50) == ["UPDATE delivery_message"]


SEND_TRANSACTIONAL = [
    "UPDATE delivery_message",  # the claim
    # record_outcomes: the sent rows, one UPDATE … FROM unnest(…), its own transaction (no
    # campaign counters to move with it: recording.record's `alone`)
    "UPDATE delivery_message",
]

SEND_CAMPAIGN = [
    "UPDATE delivery_message",  # the claim (the campaign's status checked in it)
    "SELECT FROM campaigns_template",  # the template, compiled once for the batch
    "SELECT FROM campaigns_contact",  # the recipients' contacts, in_bulk
    "SELECT FROM campaigns_campaign",  # sender and tracking opt-ins of the batch's campaigns
    "BEGIN",
    "UPDATE delivery_message",  # record_outcomes: the sent rows
    "UPDATE campaigns_campaign",  # the counters, moved by the rows that moved
    "COMMIT",
]


@pytest.fixture
def locmem_providers(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["locmem"]
    settings.EMAILHUB_PROVIDERS_BULK = ["locmem"]
    locmem.outbox.clear()


def sent(ids: list[int]) -> Callable[[], None]:
    def send() -> None:
        assert send_messages(ids).sent == len(ids)

    return send


@pytest.mark.usefixtures("locmem_providers")
def test_recording_a_batch_takes_the_same_statements_for_1_or_40_messages() -> None:
    """send_messages over the locmem provider, transactional messages: 2 statements for 1 or 40.
    The claim, then one UPDATE of the sent rows (FROM unnest) (SEND_TRANSACTIONAL)."""

    def sending(size: int) -> list[str]:
        return statements(sent([message.pk for message in factories.messages(size, prefix=f"s{size}-")]))

    assert sending(1) == sending(40) == SEND_TRANSACTIONAL
    assert len(locmem.outbox) == 41


@pytest.mark.usefixtures("locmem_providers")
def test_a_batch_with_attachments_reads_their_contents_once_for_1_or_40_messages(api: APIClient) -> None:
    """send_messages of messages that attach files: one SELECT of the batch's distinct contents
    between the claim and the record, whatever the number of messages."""

    def sending(size: int) -> list[str]:
        items = [with_pdf(n, priority="normal", to=f"a{size}-{n}@example.com") for n in range(size)]
        response = api.post("/api/v1/messages/batch", {"messages": items}, format="json")
        return statements(sent([result["id"] for result in response.json()["results"]]))

    expected = [SEND_TRANSACTIONAL[0], "SELECT FROM delivery_attachmentcontent", *SEND_TRANSACTIONAL[1:]]
    assert sending(1) == sending(40) == expected
    assert all(len(email.attachments) == 1 for email in locmem.outbox)


@pytest.mark.usefixtures("locmem_providers")
def test_a_pool_claim_takes_the_same_statements_for_1_or_20_waiting_messages(settings) -> None:  # noqa: ANN001
    """A critical task's adaptive claim (transitions.claim_pool): one statement claims what waits,
    one records it, however many it took (below the limit: a full claim also asks for help); no
    wake-up comes, so the doorbell is unset and a last claim finds none."""
    settings.EMAILHUB_TRANSACTIONAL_CLAIM_LIMIT = 50

    def sending(size: int) -> list[str]:
        ids = [m.pk for m in factories.messages(size, prefix=f"p{size}-", priority="critical")]
        return statements(lambda: send_messages(ids[:1], priority="critical"))

    assert sending(1) == sending(20) == [*SEND_TRANSACTIONAL, "UPDATE delivery_message"]
    assert len(locmem.outbox) == 21


@pytest.mark.usefixtures("locmem_providers")
def test_a_campaign_batch_takes_the_same_statements_for_1_or_40_messages() -> None:
    """send_messages of a campaign's messages (fanned out first, not counted): 8 statements for 1
    or 40. The claim; the template, the contacts and the campaign row read once per batch;
    BEGIN, the sent rows' UPDATE, the campaign counters' UPDATE, COMMIT (SEND_CAMPAIGN)."""

    def sending(size: int) -> list[str]:
        campaign = factories.sending_campaign(
            factories.make_audience(size, name=f"s{size}", prefix=f"s{size}-"), name=f"c{size}"
        )
        fanout.fan_out(campaign.pk, step_size=size, max_steps=1)
        return statements(sent(list(Message.objects.filter(campaign=campaign).values_list("pk", flat=True))))

    assert sending(1) == sending(40) == SEND_CAMPAIGN
    assert len(locmem.outbox) == 41


# --- one fan-out step ------------------------------------------------------------------------------

FANOUT_STEP = [
    # Once per fan-out, not per step: are the audience tables' statistics current? (They are:
    # the test analyzed them, so no ANALYZE follows.)
    "SELECT FROM pg_stat_user_tables",
    "BEGIN",
    "SELECT pg_try_advisory_xact_lock",  # the campaign's fan-out lock
    "SELECT FROM campaigns_campaign",  # still sending, and its cursor
    "SAVEPOINT",
    # transitions.materialise_step: the next `step` members become messages, one INSERT … SELECT
    "INSERT INTO delivery_message",
    "RELEASE",
    "INSERT INTO core_outboxtask",  # one send task per 100 ids, one INSERT
    "UPDATE campaigns_campaign",  # the cursor and counters
    "COMMIT",
    # The tasks are published, and their outbox rows deleted, by fan-out's publishing thread on
    # its own connection, while the next step runs.
]


def statistics_current() -> None:
    """The audience tables analyzed if the rows just generated made them stale, as fan-out would.

    This backend's counts of those rows reach the shared statistics only when it next flushes
    them (at most once a second, PostgreSQL 15's PGSTAT_MIN_INTERVAL): flushed first, or fan-out's
    own check could find the tables stale that this one found current."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # flushed as the statement ends
    statistics.analyze_stale(AUDIENCE_TABLES)


def test_a_fan_out_step_takes_the_same_statements_for_50_or_2000_contacts() -> None:
    """fan_out(max_steps=1) with a step as large as the list: 10 statements for 50 or 2,000
    contacts. The statistics check (once per fan-out), BEGIN, the advisory lock, the campaign row,
    SAVEPOINT, the INSERT … SELECT of the step's messages, RELEASE, the outbox INSERT, the cursor
    and counters' UPDATE, COMMIT (FANOUT_STEP)."""

    def step(size: int) -> list[str]:
        campaign = factories.sending_campaign(
            factories.make_audience(size, name=f"f{size}", prefix=f"f{size}-"), name=f"c{size}"
        )
        statistics_current()  # a bulk load's ANALYZE is not the step's cost
        shapes = statements(lambda: fanout.fan_out(campaign.pk, step_size=size, max_steps=1))
        assert Message.objects.filter(campaign=campaign).count() == size
        return shapes

    assert step(50) == step(2000) == FANOUT_STEP


def test_a_prepared_statement_whose_first_call_failed_or_that_the_session_lost_is_prepared_again(
    api: APIClient,
    settings,  # noqa: ANN001
) -> None:
    """The accept keeps working on a connection where the first PREPARE-and-EXECUTE failed after
    the PREPARE took (a PREPARE is not undone by the rollback), and after the session forgot its
    prepared statements (DISCARD ALL, as a pooler may do): each costs one failed request at most."""
    settings.EMAILHUB_PREPARED_STATEMENTS = True
    api = warmed(api)
    connection.close()
    with connection.cursor() as cursor:  # a statement that fails when it runs, after it was prepared
        with pytest.raises(DatabaseError):
            execute_prepared(cursor, "SELECT 1 / %s", [0])
        execute_prepared(cursor, "SELECT 1 / %s", [1])  # not prepared a second time
        assert cursor.fetchone() == (1,)
        cursor.execute("DISCARD ALL")
        with pytest.raises(DatabaseError):
            execute_prepared(cursor, "SELECT 1 / %s", [1])  # the session lost it: one failure
        execute_prepared(cursor, "SELECT 1 / %s", [1])
        assert cursor.fetchone() == (1,)
    for n in range(2):
        assert api.post("/api/v1/messages", factories.message_body(n), format="json").status_code == 202
