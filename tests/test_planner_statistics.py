"""Issue 18 item 6: an import leaves the planner statistics of what it loaded current, and fan-out
does not depend on autovacuum's timing (core/statistics.py). Autovacuum is switched off for the
two tables during these tests, so what is measured is emailhub's own ANALYZE, not its timing."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from django.db import connection

from campaigns import fanout
from campaigns.import_jobs import create_import_job, run_import_job
from campaigns.models import Campaign
from campaigns.selectors import AUDIENCE_TABLES
from tests.factories import make_audience, make_campaign


@pytest.fixture
def no_autovacuum(transactional_db) -> Iterator[None]:  # noqa: ANN001
    with connection.cursor() as cursor:
        for table in AUDIENCE_TABLES:
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for table in AUDIENCE_TABLES:
                cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def statistics() -> dict[str, tuple[int, float]]:
    """Per table: how many times it was ANALYZEd by hand (autovacuum's own are counted apart),
    and the row count the planner believes."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT s.relname, s.analyze_count, c.reltuples FROM pg_stat_user_tables AS s"
            " JOIN pg_class AS c ON c.oid = s.relid WHERE s.relname = ANY(%s)",
            [list(AUDIENCE_TABLES)],
        )
        return {name: (count, reltuples) for name, count, reltuples in cursor.fetchall()}


def flush_table_statistics() -> None:
    """PostgreSQL sends a backend's row counts to the shared statistics at most once a second;
    make this backend's go now, as they would by the time a campaign starts."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def test_an_import_job_analyzes_the_contacts_and_memberships_it_loaded(no_autovacuum) -> None:  # noqa: ANN001
    before = statistics()
    rows = "".join(f"i{n}@example.com,I {n}\n" for n in range(3000))
    job = create_import_job(io.BytesIO(("email,name\n" + rows).encode()), list_name="imported", publish=False)
    assert run_import_job(job.pk).status == "completed"
    after = statistics()
    for table in AUDIENCE_TABLES:
        assert after[table][0] == before[table][0] + 1, table
        assert after[table][1] >= 3000, table  # the planner knows the rows are there


def test_fan_out_analyzes_audience_tables_that_changed_a_lot_since_their_last_analysis(no_autovacuum) -> None:  # noqa: ANN001
    with connection.cursor() as cursor:
        for table in AUDIENCE_TABLES:
            cursor.execute(f"ANALYZE {table}")  # statistics of the tables as they are now
    campaign = make_campaign(make_audience(5000))  # 5,000 new rows in each: out of date
    flush_table_statistics()
    before = statistics()
    Campaign.objects.filter(pk=campaign.pk).update(status="sending")  # as scheduling it would
    assert fanout.fan_out(campaign.pk).created == 5000
    after = statistics()
    for table in AUDIENCE_TABLES:
        assert after[table][0] == before[table][0] + 1, table
        assert after[table][1] >= 5000, table

    # Current statistics: the next fan-out analyzes nothing (one catalog query).
    flush_table_statistics()
    assert fanout.fan_out(campaign.pk).created == 0
    assert statistics() == after
