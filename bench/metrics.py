"""What recording the Prometheus metrics costs the send path, against that path itself, same run.

    .venv/bin/python bench/metrics.py [--batch 100] [--repeats 200]

Measured in this process, in multiprocess mode (a temporary PROMETHEUS_MULTIPROC_DIR, as the
workers run it), on a database of its own (`emailhub_bench_metrics`):

- `metrics_python_us_per_batch`: the metrics calls a recorded batch makes after its commit
  (core.metrics.count_emails for the batch's counts, observe_latencies for each sent message,
  observe_provider_call once), for a batch of --batch sent messages (100 = EMAILHUB_BATCH_SIZE_NORMAL,
  a campaign batch);
- the SQL: the batch's `UPDATE … SET status = 'sent' … RETURNING` as it was (campaign id only) and
  as it is (plus priority and the accept → now seconds), alternated on the same rows;
- the reference: `delivery.services.recording.record()` for the same batch, the whole recording
  step the metrics ride on (its UPDATE, the campaign counters, the commit).

Last lines: `metric: value unit`, medians of --repeats; the ratio is (metrics Python + the SQL
difference) over record().
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Before anything imports prometheus_client's values (core.metrics reads it at import).
METRICS_DIR = tempfile.mkdtemp(prefix="emailhub-bench-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = METRICS_DIR

from bench.lib.common import bench_database, prepare  # noqa: E402

DATABASE = bench_database("emailhub_bench_metrics")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")

OLD_SQL = """
UPDATE delivery_message AS m
   SET status = 'sent', sent_at = clock_timestamp(), provider = %s,
       provider_message_id = v.provider_message_id, last_error = NULL
  FROM unnest(%s::bigint[], %s::text[]) AS v(id, provider_message_id)
 WHERE m.id = v.id AND m.status = 'sending'
RETURNING m.campaign_id
"""
NEW_SQL = """
UPDATE delivery_message AS m
   SET status = 'sent', sent_at = clock_timestamp(), provider = %s,
       provider_message_id = v.provider_message_id, last_error = NULL
  FROM unnest(%s::bigint[], %s::text[]) AS v(id, provider_message_id)
 WHERE m.id = v.id AND m.status = 'sending'
RETURNING m.campaign_id, m.priority,
          extract(epoch FROM clock_timestamp() - greatest(m.created_at, coalesce(m.due_at, m.created_at)))::float8
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    prepare(DATABASE, REDIS_URL)

    from django.db import connection, transaction
    from django.utils import timezone

    from core import metrics
    from delivery.models import Message
    from delivery.services.recording import record
    from delivery.services.transitions import Outcomes

    Message.objects.all().delete()
    ids = [
        m.pk
        for m in Message.objects.bulk_create(
            Message(to_email=f"r{i}@example.com", subject="s", text="t", priority="normal", status="sending")
            for i in range(args.batch)
        )
    ]
    provider_ids = [f"<{i}@bench>" for i in ids]

    # The batch's claim token: record() writes only rows still `sending` under it.
    claimed_at = timezone.now()

    def to_sending() -> None:
        Message.objects.filter(pk__in=ids).update(status="sending", claimed_at=claimed_at)

    python_us, old_ms, new_ms, record_ms = [], [], [], []
    for n in range(args.repeats):
        # The metrics calls of one recorded batch (what recording._count does after the commit).
        counts = {("smtp", "normal", "sent"): args.batch}
        latencies = {"normal": [0.5 + (i % 50) / 10 for i in range(args.batch)]}
        started = time.perf_counter()
        metrics.count_emails(counts)
        metrics.observe_latencies(latencies)
        metrics.observe_provider_call("smtp", 0.05)
        python_us.append((time.perf_counter() - started) * 1e6)

        # The SQL before and after, alternating which goes first.
        for sql, out in (
            ((OLD_SQL, old_ms), (NEW_SQL, new_ms)) if n % 2 else ((NEW_SQL, new_ms), (OLD_SQL, old_ms))
        ):
            to_sending()
            with transaction.atomic(), connection.cursor() as cursor:
                started = time.perf_counter()
                cursor.execute(sql, ["smtp", ids, provider_ids])
                cursor.fetchall()
                out.append((time.perf_counter() - started) * 1e3)

        # The reference: the whole recording step for the batch.
        to_sending()
        outcomes = Outcomes()
        outcomes.sent["smtp"] = list(zip(ids, provider_ids, strict=True))
        started = time.perf_counter()
        record(outcomes, claimed_at)  # its own transaction; the metrics calls run on its commit
        record_ms.append((time.perf_counter() - started) * 1e3)

    py, old, new, ref = median(python_us), median(old_ms), median(new_ms), median(record_ms)
    overhead_ms = py / 1e3 + max(new - old, 0.0)
    print(f"batch of {args.batch} sent messages, {args.repeats} repeats, medians (multiprocess mode)")
    print(f"  metrics calls: {py:.0f} µs per batch = {py / args.batch:.2f} µs per message")
    print(f"  UPDATE … RETURNING: before {old:.3f} ms, now {new:.3f} ms (difference {new - old:+.3f} ms)")
    print(f"  record() of the batch (reference, metrics included): {ref:.3f} ms")
    print(f"metrics_python_us_per_batch: {py:.1f} us")
    print(f"metrics_python_us_per_message: {py / args.batch:.2f} us")
    print(f"metrics_sql_extra_ms_per_batch: {new - old:.3f} ms")
    print(f"record_ms_per_batch: {ref:.3f} ms")
    print(f"metrics_overhead_ratio: {overhead_ms / ref:.4f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        import shutil

        shutil.rmtree(METRICS_DIR, ignore_errors=True)
