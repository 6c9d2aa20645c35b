from __future__ import annotations

import pytest

from core.templating import EmailTemplate, TemplateSyntaxError, check_syntax


def test_variables_defaults_and_nested_attributes_render() -> None:
    template = EmailTemplate(
        subject='Hi {{ first_name|default:"there" }}',
        html="<p>Plan: {{ plan.name }}</p>",
        text="Plan {{ plan.name }} for {{ email }}",
    )
    rendered = template.render({"email": "a@example.com", "plan": {"name": "Pro"}})
    assert rendered.subject == "Hi there"
    assert rendered.html == "<p>Plan: Pro</p>"
    assert rendered.text == "Plan Pro for a@example.com"


def test_missing_variable_renders_empty_or_the_template_default() -> None:
    template = EmailTemplate("{{ a }}|{{ b }}", "", "", defaults={"b": "B"})
    assert template.render({}).subject == "|B"


def test_html_values_are_escaped_but_text_values_are_not() -> None:
    template = EmailTemplate("s", "<b>{{ name }}</b>", "{{ name }}")
    rendered = template.render({"name": "<script>alert(1)</script> & co"})
    assert rendered.html == "<b>&lt;script&gt;alert(1)&lt;/script&gt; &amp; co</b>"
    assert rendered.text == "<script>alert(1)</script> & co"


def test_a_value_cannot_inject_a_header_line_through_the_subject() -> None:
    rendered = EmailTemplate("Hello {{ name }}", "", "").render({"name": "x\r\nBcc: victim@example.com"})
    assert "\n" not in rendered.subject and "\r" not in rendered.subject


def test_no_attribute_walking_on_objects() -> None:
    class Secret:
        password = "hunter2"

    rendered = EmailTemplate("{{ obj.password }}", "", "").render({"obj": Secret()})
    assert rendered.subject == ""


@pytest.mark.parametrize(
    "source",
    ["{{ __class__ }}", "{{ a.__init__ }}", "{{ name|upper }}", "{{ 1+1 }}", "{{ }}", "{{ a b }}"],
)
def test_anything_but_a_plain_placeholder_is_a_syntax_error(source: str) -> None:
    with pytest.raises(TemplateSyntaxError, match="line 1"):
        check_syntax(source)
