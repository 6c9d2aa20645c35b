"""The segments' data for the benches (bench/segments.py, bench/fanout.py --segment): a year of
campaigns, their messages and ~10M events over 1M contacts with attributes, in a database of
their own, generated with set-based SQL once and reused while it has the right size and is
recent enough for the relative windows ("opened in the last 90 days") to mean what they did.

The shape (all drawn with random(), so the exact counts differ from one build to the next and
are read back from the data, never assumed):

- contacts `seg-<n>@example.com` with attributes first_name, city (Hanoi for half of them, the
  rest among a few other cities), age (a number, 18..79), plan (free 60%, pro 30%, enterprise
  10%) and signup (an ISO date over the last three years); every 250th contact `unsubscribed`,
  every 500th `bounced`; every 100th address suppressed;
- lists: every 5th contact (`segbench-200k` at 1M contacts), every 20th, every 100th;
- HISTORY_CAMPAIGNS completed campaigns, one a month over the last year (the newest 5 days ago),
  campaign j sent to a random 15% + 3%·j of the contacts (a growing list), their messages `sent`
  within two hours of the campaign's start;
- per message, like production (and its first human open and click on the message, as
  record_events keeps them): `delivered` (98%) or `bounced` (2%), `deferred` before some
  deliveries; then, for a delivered message, human opens (one to three; Hanoi's contacts open
  more: 70% of their messages against 25%), machine (Apple MPP, 35%) and proxy (10%) opens that
  segments must not count, human clicks, scanner clicks, a few complaints and unsubscribes;
  opens and clicks within three days of the send.

The build runs in one transaction (all or nothing), with the secondary indexes of the two big
tables dropped during the load and created again afterwards (from their own definitions), the
foreign-key triggers off (session_replication_role = replica: every key is generated from the
rows it points to), then VACUUM ANALYZE: statistics and a visibility map as autovacuum would
leave them on tables of this age.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction

PREFIX = "seg-"
HISTORY_CAMPAIGNS = 12
# Events per history message, on average, from the kinds' probabilities below (checked: ~2.40).
EVENTS_PER_MESSAGE = 2.40
CITIES_OTHER = ["Ho Chi Minh City", "Da Nang", "Berlin", "Paris", "London", "Lagos", "Lima"]
TABLES = (
    "campaigns_contact",
    "campaigns_listmembership",
    "campaigns_suppression",
    "campaigns_campaign",
    "delivery_message",
    "delivery_emailevent",
)
# Rebuild when the newest history campaign is older than this: the 90-day windows would lose it.
MAX_AGE_DAYS = 20


@dataclass
class SegmentData:
    contacts: int
    events: int
    messages: int
    lists: dict[str, int]  # name → id
    list_sizes: dict[str, int]
    history: list[int]  # the history campaigns' ids, oldest first
    built_s: float | None  # None: reused


def list_names(contacts: int) -> dict[str, int]:
    """List name → every how many contacts is a member."""
    return {
        f"segbench-{contacts // 5}": 5,
        f"segbench-{contacts // 20}": 20,
        f"segbench-{contacts // 100}": 100,
    }


def ensure_segment_data(contacts: int, events: int, *, rebuild: bool = False) -> SegmentData:
    """The data of the module's docstring, generated if missing, of the wrong size, too old or
    `rebuild`; else reused as it is."""
    from campaigns.models import Campaign, ContactList

    names = list_names(contacts)
    built: float | None = None
    reason = "--rebuild" if rebuild else _stale(contacts, events, names)
    if reason:
        print(f"generating the segments' data ({reason}; once, not timed) ...", flush=True)
        built = _build(contacts, events, names)
    lists = dict(ContactList.objects.filter(name__in=names).values_list("name", "id"))
    history = list(
        Campaign.objects.filter(name__startswith="segbench history ")
        .order_by("started_at")
        .values_list("id", flat=True)
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM delivery_emailevent")
        (n_events,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM delivery_message WHERE campaign_id = ANY(%s)", [history])
        (n_messages,) = cursor.fetchone()
        cursor.execute(
            "SELECT l.name, count(*) FROM campaigns_listmembership AS lm JOIN campaigns_contactlist AS l "
            "ON l.id = lm.contact_list_id WHERE l.name = ANY(%s) GROUP BY l.name",
            [list(names)],
        )
        sizes = dict(cursor.fetchall())
    return SegmentData(contacts, int(n_events), int(n_messages), lists, sizes, history, built)


def _stale(contacts: int, events: int, names: dict[str, int]) -> str:
    """Why the data must be generated again ("" when it can be reused)."""
    from campaigns.models import Campaign, Contact, ContactList

    if Contact.objects.filter(email__startswith=PREFIX).count() != contacts:
        return f"not {contacts:,} contacts"
    if ContactList.objects.filter(name__in=names).count() != len(names):
        return "lists missing"
    newest = (
        Campaign.objects.filter(name__startswith="segbench history ")
        .order_by("-started_at")
        .values_list("started_at", flat=True)
    ).first()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), now() FROM delivery_emailevent")
        n_events, now = cursor.fetchone()
    if newest is None or (now - newest).days > MAX_AGE_DAYS:
        return f"the newest campaign is older than {MAX_AGE_DAYS} days"
    if not 0.9 * events <= n_events <= 1.1 * events:
        return f"{n_events:,} events, not ~{events:,}"
    return ""


def _secondary_indexes(cursor: Any, table: str) -> list[tuple[str, str]]:
    """(name, CREATE INDEX statement) of the table's indexes that back no constraint."""
    cursor.execute(
        """
        SELECT i.relname, pg_get_indexdef(x.indexrelid)
          FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid
         WHERE x.indrelid = %s::regclass
           AND NOT EXISTS (SELECT 1 FROM pg_constraint AS c WHERE c.conindid = x.indexrelid)
        """,
        [table],
    )
    return list(cursor.fetchall())


def _build(contacts: int, events: int, names: dict[str, int]) -> float:
    from bench.lib.audience import bench_template
    from campaigns.models import Campaign, ContactList

    started = time.perf_counter()
    messages_wanted = events / EVENTS_PER_MESSAGE
    # Campaign j (1..HISTORY_CAMPAIGNS) reaches a share `base + 0.03·j` of the contacts; `base`
    # chosen so that the campaigns' messages make ~`events` events.
    steps = sum(range(1, HISTORY_CAMPAIGNS + 1))
    base = (messages_wanted / contacts - 0.03 * steps) / HISTORY_CAMPAIGNS
    if base < 0:
        raise ValueError(f"{events:,} events are too few for {contacts:,} contacts")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")  # no FK triggers: keys are generated
        cursor.execute("SET LOCAL maintenance_work_mem = '512MB'")
        cursor.execute("SET LOCAL work_mem = '256MB'")
        # This database is the bench's own: start from empty tables.
        cursor.execute(f"TRUNCATE {', '.join(TABLES)}, campaigns_contactlist, campaigns_segment CASCADE")
        dropped = [
            definition
            for table in ("delivery_message", "delivery_emailevent", "campaigns_contact")
            for _, definition in _secondary_indexes(cursor, table)
        ]
        for name, _ in [
            pair
            for table in ("delivery_message", "delivery_emailevent", "campaigns_contact")
            for pair in _secondary_indexes(cursor, table)
        ]:
            cursor.execute(f'DROP INDEX "{name}"')

        _step("contacts", lambda: cursor.execute(
            """
            INSERT INTO campaigns_contact (email, name, timezone, attributes, status, created_at, updated_at)
            SELECT %(prefix)s || n || '@example.com', 'Seg ' || n,
                   CASE WHEN r.hanoi THEN 'Asia/Ho_Chi_Minh' ELSE 'UTC' END,
                   jsonb_build_object(
                       'first_name', 'Name' || n,
                       'city', CASE WHEN r.hanoi THEN 'Hanoi'
                                    ELSE (%(others)s::text[])[1 + floor(random() * %(n_others)s)::int] END,
                       'age', 18 + floor(random() * 62)::int,
                       'plan', CASE WHEN r.p < 0.6 THEN 'free' WHEN r.p < 0.9 THEN 'pro' ELSE 'enterprise' END,
                       'signup', to_char(current_date - floor(random() * 1095)::int, 'YYYY-MM-DD')),
                   CASE WHEN n %% 500 = 0 THEN 'bounced' WHEN n %% 250 = 0 THEN 'unsubscribed' ELSE 'active' END,
                   now() - interval '3 years' * random(), now()
              FROM generate_series(1, %(size)s) AS n
             CROSS JOIN LATERAL (SELECT random() < 0.5 AS hanoi, random() AS p, n AS keep) AS r
            """,
            {"prefix": PREFIX, "size": contacts, "others": CITIES_OTHER, "n_others": len(CITIES_OTHER)},
        ))  # fmt: skip
        for name, every in names.items():
            contact_list = ContactList.objects.create(name=name, description="generated by bench/segments")
            cursor.execute(
                """
                INSERT INTO campaigns_listmembership (contact_list_id, contact_id)
                SELECT %s, id FROM campaigns_contact WHERE id %% %s = 0 ORDER BY id
                """,
                [contact_list.pk, every],
            )
        cursor.execute(
            """
            INSERT INTO campaigns_suppression (email, reason, detail, created_at)
            SELECT email, 'unsubscribed', 'bench', now() FROM campaigns_contact WHERE id %% 100 = 0
            """,
            [],
        )
        template = bench_template()
        first_list = ContactList.objects.get(name=next(iter(names)))  # the audience is required
        history = []
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
        for j in range(1, HISTORY_CAMPAIGNS + 1):
            start = now - timedelta(days=(HISTORY_CAMPAIGNS - j) * 30 + 5)
            history.append(
                Campaign.objects.create(
                    name=f"segbench history {j}", template=template, contact_list=first_list,
                    status=Campaign.Status.COMPLETED, started_at=start,
                    completed_at=start + timedelta(hours=3), fanout_done=True,
                )
            )  # fmt: skip
        _step("messages", lambda: cursor.execute(
            """
            INSERT INTO delivery_message (campaign_id, contact_id, template_id, to_email, priority, status,
                                          created_at, queued_at, sent_at, provider, attempts)
            SELECT h.id, c.id, %(template)s, c.email, 'normal', 'sent', h.started_at, h.started_at,
                   h.started_at + interval '2 hours' * random(), 'ses', 1
              FROM unnest(%(ids)s::bigint[], %(starts)s::timestamptz[]) WITH ORDINALITY AS h(id, started_at, j)
             CROSS JOIN campaigns_contact AS c
             -- c.id in the draw: a condition on `h` alone would be drawn once per campaign.
             WHERE random() + 0 * c.id < %(base)s + 0.03 * h.j
             ORDER BY h.id, c.id
            """,
            {"template": template.pk, "ids": [c.pk for c in history], "starts": [c.started_at for c in history],
             "base": base},
        ))  # fmt: skip
        # Per message one draw `r` for its fate (delivered 98% / bounced 2%, deferred first for
        # 2%), then each engagement slot drawn on its own, at its probability for a contact in
        # Hanoi / elsewhere, for delivered messages only.
        _step("events", lambda: cursor.execute(
            """
            INSERT INTO delivery_emailevent (kind, provider, provider_event_id, occurred_at, payload, created_at,
                                             message_id, bounce, detail, recipient, classification)
            WITH m AS MATERIALIZED (  -- one draw `r` per message, whatever the join order below
                SELECT m.id, m.to_email, m.sent_at, c.attributes @> '{"city": "Hanoi"}' AS hanoi, random() AS r
                  FROM delivery_message AS m JOIN campaigns_contact AS c ON c.id = m.contact_id
                 WHERE m.campaign_id = ANY(%(ids)s)
            )
            SELECT s.kind, 'ses', NULL, t.at, '{}'::jsonb, t.at, m.id, s.bounce, '', m.to_email, s.class
              FROM m
             CROSS JOIN (VALUES
                 ('deferred',    '',        '',          0.96::float8, 0.98::float8, 0::float8, 0::float8, 0.0::float8),
                 ('delivered',   '',        '',          0.00,         0.98,         0,         0,         0.0),
                 ('bounced',     '',        'permanent', 0.98,         0.995,        0,         0,         0.0),
                 ('bounced',     '',        'transient', 0.995,        1.01,         0,         0,         0.0),
                 ('opened',      'human',   '',          -1,           0.98,         0.70,      0.25,      3.0),
                 ('opened',      'human',   '',          -1,           0.98,         0.35,      0.12,      3.0),
                 ('opened',      'human',   '',          -1,           0.98,         0.18,      0.06,      3.0),
                 ('opened',      'machine', '',          -1,           0.98,         0.35,      0.35,      0.1),
                 ('opened',      'proxy',   '',          -1,           0.98,         0.10,      0.10,      1.0),
                 ('clicked',     'human',   '',          -1,           0.98,         0.18,      0.06,      3.0),
                 ('clicked',     'scanner', '',          -1,           0.98,         0.03,      0.03,      0.01),
                 ('complained',  '',        '',          -1,           0.98,         0.0003,    0.0008,    2.0),
                 ('unsubscribed','',        '',          -1,           0.98,         0.002,     0.004,     2.0)
             ) AS s(kind, class, bounce, low, high, p_hanoi, p_other, days)
             CROSS JOIN LATERAL (SELECT m.sent_at + interval '1 minute' + interval '1 day' * s.days * random() AS at) AS t
             WHERE CASE WHEN s.low >= 0 THEN m.r >= s.low AND m.r < s.high
                        ELSE m.r < s.high AND random() < CASE WHEN m.hanoi THEN s.p_hanoi ELSE s.p_other END
                   END
            """,
            {"ids": [c.pk for c in history]},
        ))  # fmt: skip
        # What record_events keeps on the message: its first human open and click.
        _step("messages' first_opened_at, first_clicked_at", lambda: cursor.execute(
            """
            UPDATE delivery_message AS m SET first_opened_at = f.opened, first_clicked_at = f.clicked
              FROM (SELECT message_id, min(occurred_at) AS opened,  -- a click is an open too
                           min(occurred_at) FILTER (WHERE kind = 'clicked') AS clicked
                      FROM delivery_emailevent
                     WHERE classification = 'human' AND kind IN ('opened', 'clicked')
                     GROUP BY message_id) AS f
             WHERE f.message_id = m.id
            """
        ))  # fmt: skip
        for definition in dropped:
            _step(
                definition.split(" ON ")[0].replace("CREATE ", "").lower(),
                lambda d=definition: cursor.execute(d),
            )
        cursor.execute(
            """
            UPDATE campaigns_campaign AS c SET total_count = n.count, sent_count = n.count
              FROM (SELECT campaign_id, count(*) FROM delivery_message GROUP BY campaign_id) AS n
             WHERE n.campaign_id = c.id AND c.name LIKE 'segbench history %'
            """
        )
    with connection.cursor() as cursor:
        _step("VACUUM ANALYZE", lambda: [cursor.execute(f"VACUUM ANALYZE {table}") for table in TABLES])
    total = time.perf_counter() - started
    print(f"  generated in {total:.0f} s", flush=True)
    return total


def _step(name: str, run: Any) -> None:
    started = time.perf_counter()
    run()
    print(f"  {name}: {time.perf_counter() - started:.1f} s ({time.strftime('%H:%M:%S')})", flush=True)
