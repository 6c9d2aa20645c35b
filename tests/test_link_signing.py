"""Unsubscribe and tracking links are signed one way (core/signing.py): tokens minted before that
module existed still verify, and a rotated secret keeps every link already sent working while
the old secret is in SECRET_KEY_FALLBACKS."""

from __future__ import annotations

import pytest

from campaigns import unsubscribe
from delivery.tracking import tokens
from delivery.tracking.tokens import Click

OLD_SECRET = "issue-19-tokens-minted-before-the-signing-module"
NEW_SECRET = "the-secret-after-the-rotation"
# Minted by the code before core/signing.py (campaigns/unsubscribe.py and
# delivery/tracking/tokens.py at 12761cf) under OLD_SECRET: links of this shape are in inboxes.
ISSUED = 1796342400  # 2026-12-04 00:00 UTC
UNSUBSCRIBE = "pNVrUw1YfV86zMzbEXfmr2FWuhSjB-r2zA7y8Q"
OPEN = "PAkEQ1o7L1WxKU21ofAZhOAX963ftHgY"
CLICK = "seTr-2gjebO9ejLxAT3mlaK1HJT1iW_921FodHRwczovL3Nob3AuZXhhbXBsZS5jb20vc2FsZT94PTEmeT3DqQ"
CLICKED = Click(message_id=1234567, link=3, url="https://shop.example.com/sale?x=1&y=é")


def read_all(now: float = ISSUED + 30 * 86400) -> tuple[int, int, Click]:
    return (
        unsubscribe.read_token(UNSUBSCRIBE, now=now),
        tokens.read_open_token(OPEN),
        tokens.read_click_token(CLICK),
    )


def test_tokens_minted_before_the_signing_module_still_verify(settings) -> None:  # noqa: ANN001
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = OLD_SECRET, []
    assert read_all() == (1234567, 1234567, CLICKED)
    # And today's code mints exactly those tokens: the format did not change.
    assert unsubscribe.make_token(1234567, issued_at=ISSUED) == UNSUBSCRIBE
    assert (tokens.open_token(1234567), tokens.click_token(1234567, 3, CLICKED.url)) == (OPEN, CLICK)


def test_after_a_rotation_old_links_verify_through_the_fallback_and_new_ones_use_the_new_key(
    settings,
) -> None:  # noqa: ANN001
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = NEW_SECRET, [OLD_SECRET]
    assert read_all() == (1234567, 1234567, CLICKED)  # 30 days after it was sent, still works
    new_unsubscribe = unsubscribe.make_token(1234567, issued_at=ISSUED)
    new_open, new_click = tokens.open_token(1234567), tokens.click_token(1234567, 3, CLICKED.url)
    assert {new_unsubscribe, new_open, new_click}.isdisjoint({UNSUBSCRIBE, OPEN, CLICK})

    # Once the old secret is dropped, its links stop verifying; the new ones keep working.
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(unsubscribe.InvalidToken):
        unsubscribe.read_token(UNSUBSCRIBE, now=ISSUED + 86400)
    with pytest.raises(tokens.InvalidToken):
        tokens.read_open_token(OPEN)
    with pytest.raises(tokens.InvalidToken):
        tokens.read_click_token(CLICK)
    assert unsubscribe.read_token(new_unsubscribe, now=ISSUED + 86400) == 1234567
    assert tokens.read_open_token(new_open) == 1234567
    assert tokens.read_click_token(new_click) == CLICKED


def test_an_old_unsubscribe_link_still_expires_on_its_own_date(settings) -> None:  # noqa: ANN001
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = NEW_SECRET, [OLD_SECRET]
    settings.EMAILHUB_UNSUBSCRIBE_TOKEN_DAYS = 30
    assert unsubscribe.read_token(UNSUBSCRIBE, now=ISSUED + 30 * 86400) == 1234567
    with pytest.raises(unsubscribe.ExpiredToken):
        unsubscribe.read_token(UNSUBSCRIBE, now=ISSUED + 30 * 86400 + 1)


def test_a_token_of_one_kind_never_verifies_as_another(settings) -> None:  # noqa: ANN001
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = NEW_SECRET, [OLD_SECRET]
    with pytest.raises(tokens.InvalidToken):
        tokens.read_click_token(OPEN)
    with pytest.raises(tokens.InvalidToken):
        tokens.read_open_token(CLICK)
    with pytest.raises(tokens.InvalidToken):  # an unsubscribe token's bytes, read as an open token
        tokens.read_open_token(UNSUBSCRIBE[:32])
