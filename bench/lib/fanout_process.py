"""The measured fan-out process of bench/fanout.py (and bench/sto_fanout.py): `run_child` starts
`bench/fanout.py --child <campaign id>` in a fresh process, which calls `child` to time one
campaigns.fanout.fan_out() and print what it measured as one JSON line."""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import django
from django.db import connection

from bench.lib.common import ROOT

FANOUT_SCRIPT = ROOT / "bench" / "fanout.py"


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kb(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split(f"{field}:", 1)[1].split()[0])


def child(campaign_id: int, step: int | None) -> None:
    """Run fan_out() once in this fresh process and print what was measured as one JSON line."""
    django.setup()
    from django.conf import settings
    from django.db import connections

    from campaigns import fanout
    from core import outbox
    from delivery.services import send_tasks

    timers = {"step_sql": 0.0, "commit": 0.0, "record_outbox": 0.0, "publish": 0.0}
    tasks = [0]

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                timers[name] += time.perf_counter() - started

        return wrapper

    record_sends = send_tasks.record_sends

    def counting_record_sends(ids: list[int], priority: str, batch_size: int, **kwargs: Any) -> None:
        tasks[0] += math.ceil(len(ids) / batch_size)
        record_sends(ids, priority, batch_size, **kwargs)

    # Instrumentation of this process only: fan_out() looks these names up at call time.
    fanout._step = timed("step_sql", fanout._step)
    send_tasks.record_sends = timed("record_outbox", counting_record_sends)
    # Publishing runs on fan-out's background thread, overlapped with the next step: its time is
    # reported, but it is not on the step's critical path any more.
    outbox._publish_after_commit = timed("publish", outbox._publish_after_commit)
    # The database COMMIT alone (the on_commit publishing runs after it, timed above). Django's
    # foreign keys are DEFERRABLE INITIALLY DEFERRED: their per-row checks run here.
    database = connections["default"]
    database._commit = timed("commit", database._commit)

    with connection.cursor() as cursor:  # connected before timing, as in a running worker
        cursor.execute(
            "SELECT pg_backend_pid(), pg_current_wal_lsn()::text, checkpoints_timed + checkpoints_req "
            "FROM pg_stat_bgwriter"
        )
        backend_pid, wal_before, checkpoints_before = cursor.fetchone()
    rss_before = _status_kb("VmRSS")
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    backend_cpu_before = _proc_cpu(backend_pid)

    started = time.perf_counter()
    report = fanout.fan_out(campaign_id, step_size=step)
    wall = time.perf_counter() - started

    usage = resource.getrusage(resource.RUSAGE_SELF)
    backend_cpu = _proc_cpu(backend_pid) - backend_cpu_before
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn), "
            "checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter",
            [wal_before],
        )
        wal_bytes, checkpoints_after = cursor.fetchone()
    print(
        json.dumps(
            {
                "wall_s": wall,
                "steps": report.steps,
                "members": report.members,
                "created": report.created,
                "finished": report.finished,
                "tasks": tasks[0],
                "step_size": step or settings.EMAILHUB_FANOUT_STEP,
                "peak_rss_kb": _status_kb("VmHWM"),
                "ru_maxrss_kb": usage.ru_maxrss,
                "rss_before_kb": rss_before,
                "cpu_s": (usage.ru_utime + usage.ru_stime) - (usage_before.ru_utime + usage_before.ru_stime),
                "backend_cpu_s": backend_cpu,
                "wal_mb": float(wal_bytes) / 1e6,
                "checkpoints": int(checkpoints_after) - int(checkpoints_before),
                **{f"{name}_s": seconds for name, seconds in timers.items()},
            }
        ),
        flush=True,
    )


def run_child(env: dict[str, str], campaign_id: int, step: int | None, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, str(FANOUT_SCRIPT), "--child", str(campaign_id)]
    if step:
        argv += ["--step", str(step)]
    # Its own session, so that whatever happens here (Ctrl-C included) it is killed below.
    popen = subprocess.Popen(
        argv, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = popen.communicate(timeout=timeout)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
    if popen.returncode != 0:
        raise RuntimeError(f"the fan-out process failed ({popen.returncode}):\n{stderr[-3000:]}")
    return dict(json.loads(stdout.strip().splitlines()[-1]))
