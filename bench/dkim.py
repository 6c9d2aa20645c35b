"""DKIM micro-benchmark: CPU time of delivery/providers/dkim.py per signature and per message.

    .venv/bin/python bench/dkim.py [--messages 2000]

Keys are generated here (RSA-2048 and Ed25519). Printed, as CPU microseconds (process time, so
other load on the machine does not inflate it): one RSA-2048 and one Ed25519 signature over a
typical header block (the raw OpenSSL operation); a whole message rendered by mime.render and
signed with RSA only, Ed25519 only and both (parse, canonicalize headers and body, body hash,
signature headers); mime.render alone, for scale; and dkimpy's own RSA signing of the same
message, the pure-Python path the issue measured at ~15 ms. Target (the issue): <= 1,000 µs CPU
per RSA-2048 signature.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder is sys.path[0] and this module would shadow dkimpy's `dkim`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "emailhub.settings")

import django  # noqa: E402

django.setup()

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa  # noqa: E402

from delivery.providers.base import OutgoingEmail  # noqa: E402
from delivery.providers.dkim import DkimKey, DkimSigner  # noqa: E402
from delivery.providers.mime import render  # noqa: E402


def cpu_us(function: Callable[[], object], count: int) -> float:
    function()  # warm-up
    start = time.process_time()
    for _ in range(count):
        function()
    return (time.process_time() - start) / count * 1e6


def campaign_like_email() -> OutgoingEmail:
    # The size of bench/fanout.py's template after rendering: a short text part and ~2 KB of HTML.
    html = (
        "<html><body>"
        + "<p>Hello Ann, this week's offers are in. Read more on our site.</p>\n" * 30
        + "</body></html>"
    )
    return OutgoingEmail(
        message_id=123456,
        to="Ann Example <ann.example@example.org>",
        from_email="Shop News <news@example.com>",
        subject="Ann, this week's offers — up to 30% off",
        text="Hello Ann,\n\nthis week's offers are in.\n" * 10,
        html=html,
        headers={
            "List-Unsubscribe": "<https://mail.example.com/u/AbCdEf0123456789>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=2000, help="iterations per figure")
    parser.add_argument(
        "--dkimpy", type=int, default=20, help="iterations of dkimpy's pure-Python RSA (0: skip)"
    )
    args = parser.parse_args()
    n = args.messages

    rsa_key = DkimKey(
        "example.com", "rsa2026", rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    ed_key = DkimKey("example.com", "ed2026", ed25519.Ed25519PrivateKey.generate())
    email = campaign_like_email()
    _, message = render(email, message_id_domain="example.com")
    header_block = message.partition(b"\r\n\r\n")[0]

    figures = {
        "dkim_rsa2048_signature_us": cpu_us(lambda: rsa_key.sign(header_block), n),
        "dkim_ed25519_signature_us": cpu_us(lambda: ed_key.sign(header_block), n),
        "dkim_render_only_us": cpu_us(lambda: render(email, message_id_domain="example.com"), n),
    }
    for name, keys in (("rsa", [rsa_key]), ("ed25519", [ed_key]), ("both", [rsa_key, ed_key])):
        sign = DkimSigner(keys).sign
        figures[f"dkim_message_{name}_us"] = cpu_us(partial(sign, message, from_domain="example.com"), n)
    if args.dkimpy:
        import dkim  # dev requirement; only for the comparison

        pem = rsa_key.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        figures["dkim_dkimpy_rsa_message_us"] = cpu_us(
            lambda: dkim.sign(message, b"rsa2026", b"example.com", pem), args.dkimpy
        )

    print(f"message: {len(message)} bytes, {n} iterations per figure (CPU time per operation)")
    for name, value in figures.items():
        print(f"{name}: {value:.1f} us")


if __name__ == "__main__":
    main()
