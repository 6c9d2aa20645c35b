"""DKIM signing of SMTP mail: keys made here, signatures checked by dkimpy (an independent
implementation) against a fake DNS holding the records emailhub says to publish, on messages
received by the real aiosmtpd test server."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import re
from collections.abc import Callable, Iterator
from email import message_from_bytes, policy
from pathlib import Path

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.core.management import CommandError, call_command

from campaigns.models import Campaign, Contact
from delivery.exceptions import ProviderConfigurationError
from delivery.models import Message, MessageStatus
from delivery.providers import check_provider_settings, close_all, get_provider
from delivery.providers.base import Attachment, Outcome, OutgoingEmail
from delivery.providers.dkim import DkimSigner, canonicalize_body, canonicalize_header
from delivery.services.sending import send_messages
from delivery.testing.smtp_server import SMTPTestServer
from tests.factories import make_audience, make_campaign

UNSUBSCRIBE = {
    "List-Unsubscribe": "<https://mail.example.com/u/abc123>, <mailto:unsubscribe@example.com>",
    "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
}


def _write_pem(
    path: Path, key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path


@pytest.fixture(scope="module")
def key_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dkim")
    return {
        "rsa": _write_pem(root / "example.com" / "rsa2026.pem", rsa.generate_private_key(65537, 2048)),
        "ed25519": _write_pem(root / "example.com" / "ed2026.pem", ed25519.Ed25519PrivateKey.generate()),
        "dir": root,
    }


@pytest.fixture
def dkim_setting(key_files: dict[str, Path], settings) -> Iterator[str]:  # noqa: ANN001
    value = json.dumps(
        {
            "example.com": [
                {"selector": "rsa2026", "key": str(key_files["rsa"])},
                {"selector": "ed2026", "key": str(key_files["ed25519"])},
            ]
        }
    )
    settings.EMAILHUB_DKIM_KEYS = value
    close_all()
    yield value
    close_all()


def fake_dns(setting: str) -> Callable[..., bytes]:
    """dkimpy's DNS lookup, answered from the records DkimKey.dns_record() tells operators to publish."""
    signer = DkimSigner.from_setting(setting)
    records = {
        f"{key.dns_name()}.".encode(): key.dns_record().encode()
        for domain in signer.domains
        for key in signer.keys_for(domain)
    }
    return lambda name, timeout=5: records.get(name, b"")


def email(
    n: int = 1, *, from_email: str = "Shop <shop@example.com>", headers: dict[str, str] | None = None
) -> OutgoingEmail:
    return OutgoingEmail(
        message_id=n,
        to=f"user{n}@example.org",
        from_email=from_email,
        subject=f"Your receipt {n} — ünïcode and a subject long enough to be folded over two lines",
        text=f"Thanks for your order {n}.  \n\nTrailing spaces and blank lines follow.   \n\n\n",
        html=f"<p>Thanks for your order {n}.</p>",
        reply_to="help@example.com",
        headers=headers if headers is not None else dict(UNSUBSCRIBE),
    )


def send_and_receive(smtp: SMTPTestServer, message: OutgoingEmail) -> bytes:
    [result] = get_provider("smtp").send_batch([message])
    assert result.outcome is Outcome.ACCEPTED, result.error
    [received] = smtp.wait_for(1)
    return received.data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


def signatures(message: bytes) -> list[dict[str, str]]:
    """The tags of each DKIM-Signature, unfolded, top first."""
    found = re.findall(rb"^DKIM-Signature:(.*?)(?=^\S)", message, flags=re.MULTILINE | re.DOTALL)
    parsed = []
    for value in found:
        flat = re.sub(rb"\s+", b"", value).decode("ascii")
        parsed.append(dict(tag.split("=", 1) for tag in flat.split(";") if tag))
    return parsed


def verify_each(message: bytes, dnsfunc: Callable[..., bytes]) -> list[bool]:
    """dkimpy's verdict on each signature, top first (a body hash mismatch raises in dkimpy)."""
    verdicts = []
    for index in range(len(signatures(message))):
        try:
            verdicts.append(bool(dkim.DKIM(message).verify(idx=index, dnsfunc=dnsfunc)))
        except dkim.DKIMException:
            verdicts.append(False)
    return verdicts


def test_rsa_and_ed25519_signatures_both_verify_on_the_message_the_smtp_server_received(
    smtp: SMTPTestServer, dkim_setting: str
) -> None:
    received = send_and_receive(smtp, email())
    tags = signatures(received)
    assert [(t["a"], t["d"], t["s"], t["c"]) for t in tags] == [
        ("rsa-sha256", "example.com", "rsa2026", "relaxed/relaxed"),
        ("ed25519-sha256", "example.com", "ed2026", "relaxed/relaxed"),
    ]
    assert verify_each(received, fake_dns(dkim_setting)) == [True, True]
    # Folded to RFC 5322's 78 characters, so no relay has to refold it.
    fields = re.findall(rb"^DKIM-Signature:.*?(?=^\S)", received, flags=re.MULTILINE | re.DOTALL)
    assert len(fields) == 2
    assert max(len(line) for field in fields for line in field.split(b"\r\n")) <= 78


def test_a_message_with_attachments_and_an_inline_image_verifies_and_keeps_its_bytes(
    smtp: SMTPTestServer, dkim_setting: str
) -> None:
    pdf, logo = bytes(range(256)) * 50 + b"\r\n.\r\n", b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    files = (
        Attachment("Quittung für März.pdf", "application/pdf", pdf, hashlib.sha256(pdf).hexdigest()),
        Attachment("logo.png", "image/png", logo, hashlib.sha256(logo).hexdigest(), "logo"),
    )
    received = send_and_receive(smtp, dataclasses.replace(email(), attachments=files))
    assert verify_each(received, fake_dns(dkim_setting)) == [True, True]
    parsed = message_from_bytes(received, policy=policy.default)
    got = [(p.get_filename(), p.get_payload(decode=True)) for p in parsed.walk() if p.get_filename()]
    assert sorted(got) == sorted([("Quittung für März.pdf", pdf), ("logo.png", logo)])


def test_h_lists_both_list_unsubscribe_headers_and_the_required_ones_oversigned(
    smtp: SMTPTestServer, dkim_setting: str
) -> None:
    received = send_and_receive(smtp, email())
    assert len(signatures(received)) == 2
    for tags in signatures(received):
        names = tags["h"].split(":")
        for name in ("from", "to", "subject", "date", "message-id", "mime-version", "content-type"):
            assert names.count(name) == 2, name  # present once, listed twice: oversigned
        assert names.count("list-unsubscribe") == 2 and names.count("list-unsubscribe-post") == 2
        assert "dkim-signature" not in names and "x-emailhub-message" not in names


def test_headers_absent_from_the_message_are_not_listed_in_h(smtp: SMTPTestServer, dkim_setting: str) -> None:
    received = send_and_receive(smtp, email(headers={}))
    for tags in signatures(received):
        assert "list-unsubscribe" not in tags["h"].split(":") and "cc" not in tags["h"].split(":")
    assert verify_each(received, fake_dns(dkim_setting)) == [True, True]


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(
            lambda m: m.replace(b"https://mail.example.com/u/abc123", b"https://evil.example/u/abc123"),
            id="list-unsubscribe",
        ),
        pytest.param(
            lambda m: m.replace(b"List-Unsubscribe=One-Click", b"List-Unsubscribe=One-Clack"),
            id="list-unsubscribe-post",
        ),
        pytest.param(lambda m: m.replace(b"Subject: ", b"Subject: FW: ", 1), id="subject"),
        # A second From on top: oversigning makes the signature cover "no other From".
        pytest.param(lambda m: b"From: Bank <security@bank.example>\r\n" + m, id="added-from"),
        pytest.param(lambda m: m.replace(b"Thanks for your order", b"Thanks for your ORDER"), id="body"),
    ],
)
def test_editing_the_signed_message_after_signing_fails_verification(
    smtp: SMTPTestServer, dkim_setting: str, edit: Callable[[bytes], bytes]
) -> None:
    received = send_and_receive(smtp, email())
    dnsfunc = fake_dns(dkim_setting)
    assert verify_each(received, dnsfunc) == [True, True]
    edited = edit(received)
    assert edited != received
    assert verify_each(edited, dnsfunc) == [False, False]


def test_relaxed_canonicalization_survives_refolding_and_trailing_whitespace(
    smtp: SMTPTestServer, dkim_setting: str
) -> None:
    received = send_and_receive(smtp, email())
    head, _, body = received.partition(b"\r\n\r\n")
    # What relays do: refold a header, change a space to a tab, add spaces at line ends.
    head = head.replace(b"To: user1@example.org", b"To:\r\n\t user1@example.org   ")
    body = body.replace(b"\r\n", b"  \r\n") + b"\r\n\r\n"
    assert verify_each(head + b"\r\n\r\n" + body, fake_dns(dkim_setting)) == [True, True]


def test_a_message_whose_domain_has_no_key_is_sent_unsigned(smtp: SMTPTestServer, dkim_setting: str) -> None:
    received = send_and_receive(smtp, email(from_email="Other <news@other.example>"))
    assert b"DKIM-Signature" not in received
    assert received.startswith(b"Message-ID: ")


def test_a_subdomain_from_is_signed_with_its_parent_domain_key(
    smtp: SMTPTestServer, dkim_setting: str
) -> None:
    received = send_and_receive(smtp, email(from_email="News <news@mail.example.com>"))
    assert [t["d"] for t in signatures(received)] == ["example.com", "example.com"]
    assert verify_each(received, fake_dns(dkim_setting)) == [True, True]


def test_a_key_directory_setting_signs_like_the_json_one(
    smtp: SMTPTestServer,
    key_files: dict[str, Path],
    settings,  # noqa: ANN001
) -> None:
    settings.EMAILHUB_DKIM_KEYS = str(key_files["dir"])
    close_all()
    received = send_and_receive(smtp, email())
    assert sorted(t["s"] for t in signatures(received)) == ["ed2026", "rsa2026"]
    assert verify_each(received, fake_dns(str(key_files["dir"]))) == [True, True]


@pytest.mark.parametrize(
    "make_value, message",
    [
        (lambda files: "{not json", "not valid JSON"),
        (
            lambda files: json.dumps({"example.com": [{"selector": "s1", "key": "/nonexistent/k.pem"}]}),
            "cannot be loaded",
        ),
        (lambda files: json.dumps({"example.com": {"selector": "s1"}}), "must map to a list"),
        (
            lambda files: json.dumps(
                {"example.com": [{"selector": "bad selector!", "key": str(files["rsa"])}]}
            ),
            "not a valid selector",
        ),
        (
            lambda files: json.dumps({"example.com": [{"selector": "ec", "key": str(files["ec"])}]}),
            "RSA or Ed25519",
        ),
        (lambda files: "/nonexistent/dkim-keys", "not a directory"),
    ],
    ids=["bad-json", "missing-file", "not-a-list", "bad-selector", "ec-key", "missing-directory"],
)
def test_a_key_that_cannot_be_loaded_stops_start_up_naming_the_setting(
    key_files: dict[str, Path],
    tmp_path: Path,
    settings,
    make_value,
    message: str,  # noqa: ANN001
) -> None:
    files = dict(key_files, ec=_write_pem(tmp_path / "ec.pem", ec.generate_private_key(ec.SECP256R1())))
    settings.EMAILHUB_DKIM_KEYS = make_value(files)
    settings.EMAILHUB_PROVIDERS_TRANSACTIONAL = ["smtp"]
    close_all()
    try:
        with pytest.raises(ProviderConfigurationError, match="EMAILHUB_DKIM_KEYS") as raised:
            check_provider_settings()  # what worker start-up and `manage.py check` run
        assert message in str(raised.value)
    finally:
        close_all()


def test_relaxed_canonicalization_rules_of_rfc_6376_section_3_4_5_example() -> None:
    # RFC 6376 §3.4.5: "A: <SP> X <CRLF> B <SP> : <SP> Y <HTAB><CRLF> <HTAB> Z <SP><SP><CRLF>"
    assert canonicalize_header(b"A: X") == b"a:X\r\n"
    assert canonicalize_header(b"B : Y\t\r\n\tZ  ") == b"b:Y Z\r\n"
    assert canonicalize_body(b" C \r\nD \t E\r\n\r\n\r\n") == b" C\r\nD E\r\n"
    assert canonicalize_body(b"") == b"" and canonicalize_body(b"\r\n\r\n") == b""
    assert canonicalize_body(b"no final newline  ") == b"no final newline\r\n"


def test_body_canonicalization_shortcuts_agree_with_the_plain_rfc_rules() -> None:
    """canonicalize_body skips its regular expressions when they cannot match (a speed-up);
    every body over a small alphabet of the characters that matter must come out as the three
    rules of §3.4.4 applied literally."""

    def literal(body: bytes) -> bytes:
        body = re.sub(rb"[ \t]+(?=\r\n|\Z)", b"", body)
        body = re.sub(rb"[ \t]+", b" ", body)
        body = re.sub(rb"(?:\r\n)+\Z", b"", body)
        return body + b"\r\n" if body else b""

    alphabet = [b" ", b"\t", b"a", b"\r\n"]
    # Every string of up to 7 symbols: 21,845 bodies.
    for length in range(8):
        for symbols in itertools.product(alphabet, repeat=length):
            body = b"".join(symbols)
            assert canonicalize_body(body) == literal(body), body


def test_dkim_records_command_prints_the_records_the_verifier_accepts(
    smtp: SMTPTestServer, dkim_setting: str
) -> None:
    out = io.StringIO()
    call_command("dkim_records", stdout=out)
    printed = dict(re.findall(r'^(\S+)\. TXT "([^"]+)"', out.getvalue(), flags=re.MULTILINE))
    assert sorted(printed) == ["ed2026._domainkey.example.com", "rsa2026._domainkey.example.com"]
    assert printed["ed2026._domainkey.example.com"].startswith("v=DKIM1; k=ed25519; p=")
    records = {f"{name}.".encode(): text.encode() for name, text in printed.items()}
    received = send_and_receive(smtp, email())
    assert verify_each(received, lambda name, timeout=5: records.get(name, b"")) == [True, True]


def test_dkim_records_command_names_the_setting_when_nothing_is_configured(settings) -> None:  # noqa: ANN001
    settings.EMAILHUB_DKIM_KEYS = ""
    with pytest.raises(CommandError, match="EMAILHUB_DKIM_KEYS is empty"):
        call_command("dkim_records")


@pytest.mark.django_db(transaction=True)
def test_a_campaign_message_from_the_send_path_is_signed_over_its_one_click_headers(
    smtp: SMTPTestServer,
    dkim_setting: str,
    settings,  # noqa: ANN001
) -> None:
    """The real path: a queued campaign message claimed, rendered with campaigns' List-Unsubscribe
    headers and footer, signed by the SMTP provider, received by the SMTP server."""
    settings.EMAILHUB_PUBLIC_URL = "https://mail.example.com"
    settings.EMAILHUB_UNSUBSCRIBE_MAILTO = "unsubscribe@mail.example.com"
    campaign = make_campaign(make_audience(1))
    Campaign.objects.filter(pk=campaign.pk).update(
        status="sending", fanout_done=True, total_count=1, from_email="News <news@example.com>"
    )
    contact = Contact.objects.get(listmembership__contact_list=campaign.contact_list)
    message = Message.objects.create(
        campaign=campaign,
        contact=contact,
        template=campaign.template,
        to_email=contact.email,
        priority="normal",
        status=MessageStatus.QUEUED,
    )
    assert send_messages([message.pk]).sent == 1
    received = smtp.wait_for(1)[0].data
    assert b"List-Unsubscribe-Post: List-Unsubscribe=One-Click" in received
    tags = signatures(received)
    assert [t["d"] for t in tags] == ["example.com", "example.com"]
    for t in tags:
        names = t["h"].split(":")
        assert names.count("list-unsubscribe") == 2 and names.count("list-unsubscribe-post") == 2
    assert verify_each(received, fake_dns(dkim_setting)) == [True, True]


def test_header_canonicalization_shortcuts_agree_with_the_plain_rfc_rules() -> None:
    def literal(line: bytes) -> bytes:
        name, _, value = line.partition(b":")
        value = re.sub(rb"[ \t]+", b" ", re.sub(rb"\r\n(?=[ \t])", b"", value)).strip(b" ")
        return name.rstrip(b" \t").lower() + b":" + value + b"\r\n"

    # Folds are CRLF + WSP; every value of up to 6 of these symbols, after names with and
    # without WSP before the colon.
    alphabet = [b" ", b"\t", b"x", b"\r\n ", b"\r\n\t"]
    for length in range(7):
        for symbols in itertools.product(alphabet, repeat=length):
            for name in (b"Subject", b"SUBJECT \t"):
                line = name + b":" + b"".join(symbols)
                assert canonicalize_header(line) == literal(line), line


def test_an_applications_threading_headers_are_signed_and_its_own_are_sent_unsigned(
    smtp: SMTPTestServer, dkim_setting: str
) -> None:
    own = {
        "In-Reply-To": "<order-1@shop.example.com>",
        "References": "<order-1@shop.example.com> <r-2@shop.example.com>",
        "List-Id": "Orders <orders.shop.example.com>",
        "X-Entity-Ref-ID": "order-1",
    }
    received = send_and_receive(smtp, email(headers=own))
    assert verify_each(received, fake_dns(dkim_setting)) == [True, True]
    for tags in signatures(received):
        names = tags["h"].split(":")
        assert (
            names.count("in-reply-to") == 2 and names.count("references") == 2 and names.count("list-id") == 2
        )
        assert "x-entity-ref-id" not in names
    # Changing a signed header the application set breaks the signature, as for ours.
    forged = received.replace(b"In-Reply-To: <order-1@", b"In-Reply-To: <order-9@")
    assert verify_each(forged, fake_dns(dkim_setting)) == [False, False]
