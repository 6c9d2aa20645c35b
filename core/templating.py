"""A deliberately small template language for operator-authored email.

``{{ name }}`` inserts a value, ``{{ attributes.plan }}`` walks into dictionaries (never into
object attributes), and ``{{ name|default:"there" }}`` gives a fallback. There are no tags, no
filters beyond ``default`` and no code: a template can only read the values it is given. A
variable with no value renders as its default, the template's declared default, or "" — a
missing value never fails a batch.

A template is compiled once (per campaign batch) into a list of literal and variable parts, so
rendering a recipient is a single ``"".join``.
"""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_EXPRESSION = re.compile(
    r"""^\s*(?P<path>[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z][A-Za-z0-9_]*)*)\s*
        (?:\|\s*default\s*:\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)')\s*)?$""",
    re.VERBOSE,
)


class TemplateSyntaxError(ValueError):
    """A placeholder that is not ``{{ name }}`` or ``{{ name|default:"…" }}``."""


@dataclass(frozen=True, slots=True)
class _Variable:
    path: tuple[str, ...]
    default: str | None


_Part = str | _Variable


def _parse(source: str) -> list[_Part]:
    parts: list[_Part] = []
    position = 0
    for match in _PLACEHOLDER.finditer(source):
        if match.start() > position:
            parts.append(source[position : match.start()])
        expression = _EXPRESSION.match(match.group(1))
        if expression is None:
            line = source.count("\n", 0, match.start()) + 1
            raise TemplateSyntaxError(
                f"line {line}: {match.group(0)!r} is not a placeholder; write {{{{ name }}}} "
                f'or {{{{ name|default:"text" }}}} (letters, digits, _ and dots only)'
            )
        default = expression.group("dq")
        if default is None:
            default = expression.group("sq")
        parts.append(_Variable(tuple(expression.group("path").split(".")), default))
        position = match.end()
    if position < len(source):
        parts.append(source[position:])
    return parts


def _lookup(context: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = context
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
        if value is None:
            return None
    return value


def _no_newlines(text: str) -> str:
    # A value pulled into a header must not be able to start a new header line.
    return text.replace("\r", " ").replace("\n", " ")


class CompiledTemplate:
    """One compiled text; ``render(context)`` is cheap and never raises for missing values."""

    __slots__ = ("_parts", "_defaults", "_escape", "source")

    def __init__(
        self, source: str, *, defaults: Mapping[str, Any], escape: Callable[[str], str] | None
    ) -> None:
        self._parts = _parse(source)
        self._defaults = defaults
        self._escape = escape
        # Kept so a per-batch transformation (click tracking rewrites links) can recompile it.
        self.source = source

    @property
    def defaults(self) -> Mapping[str, Any]:
        return self._defaults

    def uses(self, name: str) -> bool:
        """Whether a placeholder reads the top-level variable `name` (`{{ name }}`, `{{ name.x }}`)."""
        return any(isinstance(part, _Variable) and part.path[0] == name for part in self._parts)

    def render(self, context: Mapping[str, Any]) -> str:
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = _lookup(context, part.path)
            if value is None or value == "":
                value = part.default if part.default is not None else _lookup(self._defaults, part.path)
            text = "" if value is None else str(value)
            out.append(self._escape(text) if self._escape else text)
        return "".join(out)


def _escape_html(text: str) -> str:
    return html_lib.escape(text, quote=True)


@dataclass(frozen=True, slots=True)
class RenderedEmail:
    subject: str
    html: str
    text: str


class EmailTemplate:
    """Subject, HTML and text compiled together. HTML values are escaped; the subject is one line."""

    __slots__ = ("subject", "html", "text")

    def __init__(self, subject: str, html: str, text: str, defaults: Mapping[str, Any] | None = None):
        defaults = defaults or {}
        self.subject = CompiledTemplate(subject, defaults=defaults, escape=_no_newlines)
        self.html = CompiledTemplate(html, defaults=defaults, escape=_escape_html)
        self.text = CompiledTemplate(text, defaults=defaults, escape=None)

    def render(self, context: Mapping[str, Any]) -> RenderedEmail:
        return RenderedEmail(
            subject=_no_newlines(self.subject.render(context)).strip(),
            html=self.html.render(context),
            text=self.text.render(context),
        )


def check_syntax(source: str) -> None:
    """Raise TemplateSyntaxError with the line of the first malformed placeholder."""
    _parse(source)
