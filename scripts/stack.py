"""Start and stop emailhub's processes: used by the demo, the benchmarks and the tests.

PROCESSES is the one list of process commands; the README and docker-compose.yml show the same
commands (a test checks that they agree). Every process runs in its own session so that stopping
or killing it takes its children (gunicorn and Celery workers fork) with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core.metrics_dir import MULTIPROC_ENV

ROOT = Path(__file__).resolve().parent.parent

# name -> command, as a user types it (see README "Running each process by hand").
PROCESSES: dict[str, list[str]] = {
    # gthread: keep-alive connections (the sync worker closes every one); with the WSGI fast path
    # it took tracking hits from 1,223 to ~2,700 hits/s (docs/delivery.md "Tracking").
    "web": [
        "gunicorn", "emailhub.wsgi", "--bind", "127.0.0.1:8000", "--workers", "2",
        "--worker-class", "gthread", "--threads", "4", "--config", "emailhub/gunicorn_conf.py",
    ],
    "worker-transactional": [
        "celery", "-A", "emailhub", "worker", "-Q", "critical,high,system",
        "--prefetch-multiplier", "1", "--concurrency", "2", "-n", "transactional@%h",
        "--without-mingle", "--without-gossip", "--loglevel", "INFO",
    ],
    "worker-bulk": [
        "celery", "-A", "emailhub", "worker", "-Q", "normal,low,campaigns,system",
        "--concurrency", "2", "-n", "bulk@%h", "--without-mingle", "--without-gossip",
        "--loglevel", "INFO",
    ],
    # Outbound webhooks on a worker of their own: a slow or dead receiver holds none of the
    # processes that send mail (outbound/services/delivering.py). Threads: the work is waiting on
    # receivers, and eight threads cost one process's memory; an endpoint takes two at most.
    "worker-webhooks": [
        "celery", "-A", "emailhub", "worker", "-Q", "webhooks",
        "--pool", "threads", "--prefetch-multiplier", "1", "--concurrency", "8", "-n", "webhooks@%h",
        "--without-mingle", "--without-gossip", "--loglevel", "INFO",
    ],
    "beat": [
        "celery", "-A", "emailhub", "beat", "-S", "django_celery_beat.schedulers:DatabaseScheduler",
        "--loglevel", "INFO",
    ],
    "scheduler": ["python", "manage.py", "run_scheduler"],
    "smtp-sink": ["python", "manage.py", "smtp_sink", "--port", "1025"],
}  # fmt: skip

READY_MARKERS = {
    "worker-transactional": "ready.",
    "worker-bulk": "ready.",
    "worker-webhooks": "ready.",
    "beat": "beat: Starting",
    "scheduler": "scheduler running",
    "smtp-sink": "SMTP sink listening",
}


def _executable(argv: list[str]) -> list[str]:
    """Run the command with this interpreter's packages (the project's virtualenv)."""
    head, *rest = argv
    if head == "python":
        return [sys.executable, *rest]
    if head in {"celery", "gunicorn"}:
        return [sys.executable, "-m", head, *rest]
    return argv


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """Replace the value after `option` (e.g. change --port or --bind for a test)."""
    argv = list(argv)
    argv[argv.index(option) + 1] = value
    return argv


_static_collected: set[str] = set()


def collect_static(env: dict[str, str]) -> None:
    """Make STATIC_ROOT current before a web process starts, once per static root per process.

    With EMAILHUB_DEBUG=false gunicorn serves /static/ only from what `collectstatic` put in
    STATIC_ROOT, and the admin's pages fail without its manifest (scripts/collect_static.py
    skips the work when nothing changed and locks out concurrent runs).
    """
    root = env.get("EMAILHUB_STATIC_ROOT", "")
    if root in _static_collected:
        return
    result = subprocess.run(
        [sys.executable, "scripts/collect_static.py"],
        cwd=ROOT,
        env={**env, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"collectstatic failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    _static_collected.add(root)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Stack:
    """A set of emailhub processes sharing one environment; stop() ends them all."""

    env: dict[str, str]
    log_dir: Path
    processes: dict[str, Process] = field(default_factory=dict)
    # The Prometheus multiprocess directory every process of this stack shares, fresh and its
    # own (core/metrics_dir.py): a test, a bench and the demo running at once on one machine
    # never sum or wipe each other's counts. An env that names one keeps it.
    metrics_dir: Path = field(init=False)
    _own_metrics_dir: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        named = self.env.get(MULTIPROC_ENV)
        if named:
            self.metrics_dir = Path(named)
        else:
            self.metrics_dir = Path(tempfile.mkdtemp(prefix="emailhub-metrics-"))
            self._own_metrics_dir = True
            self.env = {**self.env, MULTIPROC_ENV: str(self.metrics_dir)}
        # The workers' liveness files (core/liveness.py) beside the stack's logs: two stacks on one
        # machine (a test, a bench, the demo) run workers of the same node names, and one's file
        # must not vouch for the other's worker.
        self.env = {"EMAILHUB_WORKER_LIVENESS_DIR": str(self.log_dir), **self.env}

    def start(
        self,
        name: str,
        argv: list[str] | None = None,
        *,
        ready: Callable[[Process], bool] | None = None,
        timeout: float = 30.0,
        extra_env: dict[str, str] | None = None,
        key: str | None = None,
    ) -> Process:
        """Start process `name` (or `argv`), wait until it is ready, return it.

        `key` names this instance when several of one kind run (two schedulers, say).
        """
        key = key or name
        if name == "web":
            collect_static({**os.environ, **self.env, **(extra_env or {})})
        argv = _executable(argv or PROCESSES[name])
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{key}.log"
        log_file = log_path.open("wb")
        popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, **self.env, **(extra_env or {}), "PYTHONUNBUFFERED": "1"},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log_file.close()
        process = Process(key, popen, log_path)
        self.processes[key] = process
        if ready is None and name in READY_MARKERS:
            marker = READY_MARKERS[name]
            ready = lambda p: marker in p.log()  # noqa: E731
        if ready is not None:
            self._wait_ready(process, ready, timeout)
        return process

    def _wait_ready(self, process: Process, ready: Callable[[Process], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process.alive:
                raise RuntimeError(f"{process.name} exited during start-up:\n{process.log()[-3000:]}")
            try:
                if ready(process):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop(process.name)
        raise RuntimeError(f"{process.name} not ready after {timeout:.0f}s:\n{process.log()[-3000:]}")

    def start_web(self, port: int, *, workers: int = 2, extra_env: dict[str, str] | None = None) -> Process:
        argv = with_option(PROCESSES["web"], "--bind", f"127.0.0.1:{port}")
        argv = with_option(argv, "--workers", str(workers))
        url = f"http://127.0.0.1:{port}/healthz"

        def ready(_: Process) -> bool:
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)

        return self.start("web", argv, ready=ready, extra_env=extra_env)

    def signal(self, key: str, sig: int) -> None:
        process = self.processes[key]
        try:
            os.killpg(process.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self, key: str) -> None:
        """SIGKILL the process and its children, as a crash would."""
        self.signal(key, signal.SIGKILL)
        self.processes[key].popen.wait(timeout=10)

    def stop(self, key: str, timeout: float = 15.0) -> None:
        process = self.processes.get(key)
        if process is None:
            return
        if process.alive:
            self.signal(key, signal.SIGTERM)
            try:
                process.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal(key, signal.SIGKILL)
                process.popen.wait(timeout=10)
        # Children left in the group (a forked worker) go too.
        self.signal(key, signal.SIGKILL)
        del self.processes[key]

    def stop_all(self, timeout: float = 15.0, *, graceful: bool = True) -> None:
        """SIGTERM every process at once, then wait for each (SIGKILL after `timeout`): the
        processes shut down side by side, not one after the other (a Celery worker's warm
        shutdown takes a second or more; the suite spent 137 s in sequential teardowns).
        `graceful=False` SIGKILLs them at once: a test's teardown, where nothing is left to finish
        and nothing reads what a shutdown writes."""
        for key, process in self.processes.items():
            if process.alive:
                self.signal(key, signal.SIGTERM if graceful else signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for key, process in list(self.processes.items()):
            try:
                process.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.signal(key, signal.SIGKILL)
                process.popen.wait(timeout=10)
            self.signal(key, signal.SIGKILL)  # children left in the group (a forked worker) go too
            del self.processes[key]
        if self._own_metrics_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)


@contextmanager
def running_stack(env: dict[str, str], log_dir: Path) -> Iterator[Stack]:
    stack = Stack(env=env, log_dir=log_dir)
    try:
        yield stack
    finally:
        stack.stop_all()
