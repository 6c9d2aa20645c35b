"""SMTP sinks for benchmarks: Postfix's `smtp-sink` (C) by default, aiosmtpd as a fallback.

A throughput benchmark must not measure its sink: an aiosmtpd sink caps near 2,300 msgs/s on
this machine, Postfix's `smtp-sink` goes several times faster (see /work/shared/BENCH.md).
Postfix is not installed; its Debian package is downloaded once with `apt-get download` and
unpacked with `dpkg -x` into bench/.cache/postfix (git-ignored), which configures no mail
server. The binary then runs from there with LD_LIBRARY_PATH pointing at the unpacked
libpostfix-*.so (every other library it links is part of the base system).

Counting: with `-c`, smtp-sink writes `sess=N quit=N mesg=N\\r` to stdout and flushes it each
time it sees the "." that ends a message's DATA, i.e. just before it answers 250. Unlike a
capture (`-d`/`-D`), which writes one file per message and costs disk I/O on the measured
machine, the counter is one small write per message and is exact.

    with PostfixSink() as sink:       # raises SinkUnavailable if Postfix cannot be had
        ...  # point the SMTP client at 127.0.0.1:sink.port
        sink.count()                  # messages received so far

AiosmtpdSink (`python manage.py smtp_sink`) has the same interface, but that command reports
its count only when it stops: use `stop()`, which returns the final count for both sinks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parents[2]
POSTFIX_DIR = ROOT / "bench" / ".cache" / "postfix"
SMTP_SINK = POSTFIX_DIR / "usr" / "sbin" / "smtp-sink"
POSTFIX_LIBS = POSTFIX_DIR / "usr" / "lib" / "postfix"


class SinkUnavailable(RuntimeError):
    """Postfix's smtp-sink cannot be downloaded, unpacked or started on this machine."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def ensure_postfix() -> Path:
    """Return the path of smtp-sink, downloading and unpacking Postfix's package if needed."""
    if SMTP_SINK.exists() and POSTFIX_LIBS.is_dir():
        return SMTP_SINK
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise SinkUnavailable("apt-get/dpkg not found: cannot fetch Debian's postfix package")
    print(f"fetching Postfix's smtp-sink into {POSTFIX_DIR} (apt-get download postfix)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="postfix-deb-") as tmp:
        work = Path(tmp)
        download = _run(["apt-get", "download", "postfix"], work)
        if download.returncode != 0:
            # A stale package index is the usual cause (the package version it names is gone).
            _run(["apt-get", "update"], work)
            download = _run(["apt-get", "download", "postfix"], work)
        debs = sorted(work.glob("postfix_*.deb"))
        if download.returncode != 0 or not debs:
            raise SinkUnavailable(f"`apt-get download postfix` failed:\n{download.stderr.strip()[-2000:]}")
        # Unpack next to the cache and rename, so an interrupted unpack never looks complete.
        staging = POSTFIX_DIR.with_name("postfix.partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        unpack = _run(["dpkg", "-x", str(debs[-1]), str(staging)], work)
        if unpack.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise SinkUnavailable(f"`dpkg -x` failed:\n{unpack.stderr.strip()[-2000:]}")
        shutil.rmtree(POSTFIX_DIR, ignore_errors=True)
        staging.rename(POSTFIX_DIR)
    if not SMTP_SINK.exists():
        raise SinkUnavailable(f"the postfix package has no {SMTP_SINK.relative_to(POSTFIX_DIR)}")
    return SMTP_SINK


class _SinkProcess:
    """A sink subprocess in its own session, so that stopping it can never leave a child behind."""

    name = "sink"

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._dir: Path | None = None  # holds the sink's stdout and stderr while it runs
        self._popen: subprocess.Popen[bytes] | None = None
        self._final_count: int | None = None

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _parse_count(self, stdout: str) -> int | None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def stdout_path(self) -> Path:
        assert self._dir is not None, "the sink is not running"
        return self._dir / "stdout"

    def start(self, timeout: float = 15.0) -> None:
        argv, env = self._argv()
        self._dir = Path(tempfile.mkdtemp(prefix="smtp-sink-"))
        with self.stdout_path.open("wb") as out, (self._dir / "stderr").open("wb") as err:
            self._popen = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            while not self._ready():
                if self._popen.poll() is not None:
                    raise SinkUnavailable(f"{self.name} exited at start-up:\n{self._output()}")
                if time.monotonic() > deadline:
                    raise SinkUnavailable(
                        f"{self.name} not listening after {timeout:.0f}s:\n{self._output()}"
                    )
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def _output(self) -> str:
        assert self._dir is not None
        text = "".join((self._dir / name).read_text(errors="replace") for name in ("stdout", "stderr"))
        return text[-2000:]

    def _listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def count(self) -> int:
        """Messages the sink has accepted so far (after stop(): in all)."""
        if self._final_count is not None:
            return self._final_count
        found = self._parse_count(self.stdout_path.read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"{self.name} reports its count only when stopped; use stop()")
        return found

    def stop(self) -> int | None:
        """Stop the sink (and anything in its session); return the final count when known."""
        popen, self._popen = self._popen, None
        if popen is not None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(popen.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    popen.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            self._final_count = self._parse_count(self.stdout_path.read_text(errors="replace"))
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return self._final_count


class PostfixSink(_SinkProcess):
    name = "postfix smtp-sink"

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        binary = ensure_postfix()
        # The libpostfix-*.so it links are not on the system's library path; the rest are.
        libraries = [str(POSTFIX_LIBS), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libraries)}
        # As root smtp-sink refuses to run without dropping privileges (-u) after binding.
        privileges = ["-u", "nobody"] if os.geteuid() == 0 else []
        # -c: exact per-message counter on stdout; backlog 256 as in Postfix's examples.
        return [str(binary), "-c", *privileges, f"{self.host}:{self.port}", "256"], env

    def _ready(self) -> bool:
        return self._listening()

    def _parse_count(self, stdout: str) -> int | None:
        counts = re.findall(r"mesg=(\d+)", stdout)
        return int(counts[-1]) if counts else 0


class AiosmtpdSink(_SinkProcess):
    """`python manage.py smtp_sink`: fine for latency runs, caps near 2,300 msgs/s on this machine."""

    name = "aiosmtpd smtp_sink"

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "manage.py", "smtp_sink", "--host", self.host, "--port", str(self.port)]
        return argv, {**os.environ, "PYTHONUNBUFFERED": "1"}

    def _ready(self) -> bool:
        return "SMTP sink listening" in self.stdout_path.read_text(errors="replace")

    def _parse_count(self, stdout: str) -> int | None:
        found = re.search(r"stopping after (\d+) message", stdout)
        return int(found.group(1)) if found else None


def open_sink(kind: str) -> _SinkProcess:
    """A not-yet-started sink: "postfix" or "aiosmtpd"."""
    return {"postfix": PostfixSink, "aiosmtpd": AiosmtpdSink}[kind]()
