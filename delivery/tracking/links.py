"""Rewriting a message's HTML for open and click tracking, compiled once per batch.

`TrackedHtml` splits the HTML (a template's source, or a transactional message's literal HTML)
ONCE into literal chunks and slots: every rewritable `<a href>` / `<area href>` value becomes a
link slot, and the point before the last `</body>` (else the end) an open-pixel slot. Rendering
a recipient then joins the chunks and fills each slot with a token (one HMAC per link): no HTML
is parsed per recipient. A link whose URL holds placeholders (`?id={{ contact.id }}`) is rendered
per recipient and that recipient's URL is signed.

Not rewritten: `mailto:`, `tel:`, `#anchors`, relative and other non-http(s) URLs, anything
too long to sign, and the unsubscribe link (`{{ unsubscribe_url }}`: it must work without
tracking, and a scanner following it through us would look like a person).
"""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.templating import CompiledTemplate
from delivery.tracking.tokens import MAX_LINKS, click_url, open_url, trackable

# An anchor or image-map area start tag, and its href attribute (quoted; an unquoted href is
# left alone). Tags are matched without `>` inside, which a template placeholder never needs.
_TAG = re.compile(r"<(?:a|area)\b[^>]*>", re.IGNORECASE)
_HREF = re.compile(r"""(\bhref\s*=\s*)(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
_BODY_END = re.compile(r"</body\s*>", re.IGNORECASE)
_NEVER = ("mailto:", "tel:", "sms:", "#", "javascript:", "data:")
UNSUBSCRIBE_VARIABLE = "unsubscribe_url"  # campaigns.unsubscribe.URL_VARIABLE

PIXEL_HTML = '<img src="{}" width="1" height="1" alt="" style="display:block;border:0;width:1px;height:1px">'


@dataclass(frozen=True, slots=True)
class _Link:
    index: int
    url: CompiledTemplate | str  # html-escaped as written in the attribute


class _Pixel:
    pass


_Chunk = CompiledTemplate | str | _Link | _Pixel


def _escape(text: str) -> str:
    return html_lib.escape(text, quote=True)


class TrackedHtml:
    """An HTML body with its links and pixel as slots. `links` is how many links it tracks."""

    __slots__ = ("_chunks", "links")

    def __init__(self, source: str, *, template: bool, defaults: Mapping[str, Any] | None = None):
        defaults = defaults or {}

        def literal(text: str) -> CompiledTemplate | str:
            return CompiledTemplate(text, defaults=defaults, escape=_escape) if template else text

        ends = list(_BODY_END.finditer(source))
        pixel_at = ends[-1].start() if ends else len(source)
        chunks: list[_Chunk] = []
        position = 0
        links = 0

        def add_literal(upto: int) -> None:
            nonlocal position
            if upto > position:
                chunks.append(literal(source[position:upto]))
            position = upto

        for tag in _TAG.finditer(source):
            href = _HREF.search(tag.group(0))
            if href is None or links >= MAX_LINKS:
                continue
            group = 2 if href.group(2) is not None else 3
            value = href.group(group)
            if not self._rewritable(value):
                continue
            start, end = tag.start() + href.start(group), tag.start() + href.end(group)
            if start < pixel_at <= end:
                continue  # cannot happen with well-formed HTML; never split a URL
            if position <= pixel_at < start:
                add_literal(pixel_at)
                chunks.append(_Pixel())
            add_literal(start)
            chunks.append(_Link(links, literal(value)))
            links += 1
            position = end
        if position <= pixel_at:
            add_literal(pixel_at)
            chunks.append(_Pixel())
        add_literal(len(source))
        self._chunks = chunks
        self.links = links

    @staticmethod
    def _rewritable(value: str) -> bool:
        stripped = value.strip().lower()
        if not stripped or stripped.startswith(_NEVER):
            return False
        if UNSUBSCRIBE_VARIABLE in stripped:
            return False
        # A URL made entirely of a placeholder is decided per recipient (trackable() at render).
        return stripped.startswith(("http://", "https://", "{{"))

    @classmethod
    def from_compiled(cls, compiled: CompiledTemplate) -> TrackedHtml:
        return cls(compiled.source, template=True, defaults=compiled.defaults)

    def render(self, context: Mapping[str, Any], message_id: int, *, opens: bool, clicks: bool) -> str:
        out: list[str] = []
        for chunk in self._chunks:
            if isinstance(chunk, str):
                out.append(chunk)
            elif isinstance(chunk, CompiledTemplate):
                out.append(chunk.render(context))
            elif isinstance(chunk, _Link):
                written = chunk.url if isinstance(chunk.url, str) else chunk.url.render(context)
                url = html_lib.unescape(written).strip()
                if clicks and trackable(url):
                    out.append(_escape(click_url(message_id, chunk.index, url)))
                else:
                    out.append(written)
            elif opens:
                out.append(PIXEL_HTML.format(_escape(open_url(message_id))))
        return "".join(out)
