"""What the benches compute from what they measured: percentiles, and a process group's peak
memory and CPU time (from /proc)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile: a value that was really observed."""
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def group_stats(pgid: int) -> tuple[int, float]:
    """Sum of peak RSS (VmHWM, kB) and of CPU seconds over the live processes of a process group.

    Stack starts each process in its own session, so the group is the master and its forked
    children. Summing per-process peaks counts shared pages more than once: an upper bound.
    """
    rss_kb, cpu_ticks = 0, 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # After "(comm)", which may hold spaces: state ppid pgrp ... utime(11) stime(12).
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            cpu_ticks += int(fields[11]) + int(fields[12])
            status = (proc / "status").read_text()
            rss_kb += int(status.split("VmHWM:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
    return rss_kb, cpu_ticks / os.sysconf("SC_CLK_TCK")
