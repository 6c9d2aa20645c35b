"""Run `collectstatic` when the static sources changed since the last run (scripts/stack.py).

gunicorn with EMAILHUB_DEBUG=false serves /static/ from STATIC_ROOT only (WhiteNoise), and the
hashed-name storage refuses to render a page naming a file it never collected, so every web
process the demo, the benchmarks and the tests start needs a collected STATIC_ROOT. Several test
runs share one tree: the work happens under an exclusive lock, and is skipped when the stamp
(every source file's path, size and mtime) matches, so a running gunicorn never sees its
manifest rewritten for nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "emailhub.settings")


def sources_fingerprint() -> str:
    from django.contrib.staticfiles.finders import get_finders

    digest = hashlib.sha256()
    for finder in get_finders():
        for path, storage in sorted(finder.list([]), key=lambda item: item[0]):
            stat = os.stat(storage.path(path))
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def main() -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    root = Path(settings.STATIC_ROOT)
    # The lock and the stamp live in var/ (git-ignored), not in STATIC_ROOT, which is served.
    state = ROOT / "var" / f"collectstatic-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    state.parent.mkdir(parents=True, exist_ok=True)
    with state.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = state.with_suffix(".stamp")
        fingerprint = sources_fingerprint()
        if (root / "staticfiles.json").exists() and stamp.exists() and stamp.read_text() == fingerprint:
            return 0
        call_command("collectstatic", interactive=False, verbosity=0)
        stamp.write_text(fingerprint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
