"""The MIME every raw provider sends, parsed back with the standard library's strictest policy."""

from __future__ import annotations

from email import message_from_bytes, policy

import pytest

from delivery.providers.base import OutgoingEmail
from delivery.providers.mime import render


def parse(email: OutgoingEmail):  # noqa: ANN201
    message_id, data = render(email, message_id_domain="mail.example.com")
    assert b"\r\n" in data and b"\n" not in data.replace(b"\r\n", b"")  # CRLF only
    assert all(len(line) <= 998 for line in data.split(b"\r\n"))
    parsed = message_from_bytes(data, policy=policy.default)
    assert parsed.defects == [] and all(part.defects == [] for part in parsed.walk())
    assert parsed["Message-ID"] == message_id
    return parsed


def mail(**fields: object) -> OutgoingEmail:
    defaults = {
        "message_id": 7,
        "to": "ann@example.com",
        "from_email": "shop@example.com",
        "subject": "Hi",
        "text": "t",
        "html": "<p>h</p>",
    }
    return OutgoingEmail(**{**defaults, **fields})  # type: ignore[arg-type]


def test_long_unicode_subject_is_encoded_folded_and_round_trips() -> None:
    subject = "Ihre Bestellung — größer als erwartet, 注文確認 " * 4
    parsed = parse(mail(subject=subject))
    assert parsed["Subject"] == subject


def test_display_names_with_unicode_and_specials_round_trip() -> None:
    parsed = parse(
        mail(from_email='"Zoë, Shop Team" <shop@example.com>', reply_to='"Help" <help@example.com>')
    )
    assert parsed["From"].addresses[0].display_name == "Zoë, Shop Team"
    assert parsed["From"].addresses[0].addr_spec == "shop@example.com"
    assert parsed["Reply-To"].addresses[0].addr_spec == "help@example.com"


def test_bodies_with_dots_long_lines_and_unicode_round_trip() -> None:
    text = ".\n..leading dots\n" + "x" * 500 + "\nünïcödé ✓\r\nwindows line\n\ttab end \n"
    html = "<p>" + "y" * 2000 + "</p>\n<p>naïve</p>"
    parsed = parse(mail(text=text, html=html))
    assert parsed.get_content_type() == "multipart/alternative"
    plain, rich = parsed.get_payload()
    assert plain.get_content().replace("\r\n", "\n") == text.replace("\r\n", "\n")
    assert rich.get_content().replace("\r\n", "\n") == html


def test_text_only_message_is_a_single_text_part() -> None:
    parsed = parse(mail(html=""))
    assert parsed.get_content_type() == "text/plain" and parsed.get_content() == "t\r\n"


def test_html_only_message_gets_a_text_alternative() -> None:
    parsed = parse(mail(text=""))
    plain, rich = parsed.get_payload()
    assert plain.get_content() and rich.get_content() == "<p>h</p>"


@pytest.mark.parametrize("field", ["subject", "to", "from_email", "reply_to"])
def test_a_line_break_in_a_header_value_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match="line breaks"):
        render(mail(**{field: "a@example.com\r\nBcc: x@example.com"}), message_id_domain="d")


def test_a_non_ascii_local_part_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="SMTPUTF8"):
        render(mail(to="zoë@example.com"), message_id_domain="d")


def test_an_international_domain_is_sent_as_punycode() -> None:
    parsed = parse(mail(to="ann@bücher.example"))
    assert parsed["To"].addresses[0].addr_spec == "ann@xn--bcher-kva.example"
