"""The multiprocess metrics directory (`PROMETHEUS_MULTIPROC_DIR`): the name each process's files
carry, when the directory may be wiped, and marking a dead process.

Every process of one deployment (gunicorn workers, Celery prefork children) writes its own files
there and `/metrics` sums them, so the counts of a process that died stay in the sums: that is
what keeps a counter from going backwards when a worker is killed. Files are named
`<type>_<host>-<pid>.db` (core.metrics sets the identifier): the host part keeps two containers
sharing one volume, whose pids overlap, from writing the same file.

Wiping: stale files from a previous run must go at start, but never the files of processes
still running (a web restarted beside running workers would lose their counts for good: they
keep writing into unlinked files). So `prepare` wipes only when no file belongs to a process
that may be alive: a live pid on this host, or any file of another host (which cannot be
checked from here). scripts/stack.py goes further and gives each stack a fresh directory of its
own, so tests, benchmarks and the demo on one machine never share one.

No metric is created here: the gunicorn master imports this module (emailhub/gunicorn_conf.py).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from prometheus_client import multiprocess

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _host() -> str:
    # No `_`: prometheus_client splits file names on it to find the type.
    return socket.gethostname().replace("_", "-") or "host"


def process_identifier(pid: int | None = None) -> str:
    """`<host>-<pid>` of this process (or of `pid` on this host)."""
    return f"{_host()}-{os.getpid() if pid is None else pid}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def files_in_use(path: Path) -> list[Path]:
    """The files in `path` that may belong to a running process other than this one."""
    here, me = _host(), os.getpid()
    in_use = []
    for file in sorted(path.glob("*.db")):
        identifier = file.stem.rsplit("_", 1)[-1]
        host, _, pid = identifier.rpartition("-")
        if host != here or not pid.isdigit():
            in_use.append(file)  # another host's (or not ours): cannot tell, keep
        elif int(pid) != me and _pid_alive(int(pid)):
            in_use.append(file)
    return in_use


def prepare(path: str | os.PathLike[str]) -> bool:
    """Create the directory; wipe its files if no running process uses it. True if wiped."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    in_use = files_in_use(directory)
    if in_use:
        logger.warning(
            "%s=%s is in use by running processes (%s): kept as it is",
            MULTIPROC_ENV,
            directory,
            ", ".join(f.name for f in in_use[:5]),
        )
        return False
    for file in directory.glob("*.db"):
        file.unlink(missing_ok=True)
    return True


def mark_dead(pid: int, path: str | None = None) -> None:
    """A process of this host exited: drop its live-gauge files (its counters stay summed)."""
    directory = path or os.environ.get(MULTIPROC_ENV)
    if directory:
        multiprocess.mark_process_dead(process_identifier(pid), directory)  # type: ignore[no-untyped-call]
