"""An operator's test send of a template: one transactional message through the normal pipeline.

The admin's template page calls this. The message is accepted exactly as `POST /api/v1/messages`
accepts one (`messages.accept_message`: one transaction, outbox, published after commit), at
`critical` or `high` priority, and rendered by the worker with the chosen contact's variables, so
what arrives is what a campaign would send that contact. It is marked as a test by its
`test_send_by` column (the operator's user name), which the admin's message list filters on;
nothing else treats it differently (suppressions apply as to any send).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email

from campaigns.models import Contact, Priority, Template
from campaigns.services import contact_context
from delivery.exceptions import InvalidTestSend
from delivery.models import Message
from delivery.services.messages import NewMessage, accept_message

TEST_SEND_PRIORITIES = (Priority.CRITICAL, Priority.HIGH)


def check_recipient(value: str) -> str:
    """The address rule of the message API's `to`: one plain address, no line breaks."""
    value = value.strip()
    if not value or "\r" in value or "\n" in value:
        raise InvalidTestSend({"to": "give one email address (no line breaks)"})
    try:
        validate_email(value)
    except DjangoValidationError:
        raise InvalidTestSend({"to": f"{value!r} is not a valid email address"}) from None
    return value


def send_test(
    template: Template,
    to: str,
    *,
    contact: Contact | None = None,
    priority: str = Priority.HIGH,
    operator: str = "",
) -> Message:
    """Accept one test message of `template` to `to`, rendered with `contact`'s variables.

    Raises InvalidTestSend (field → reason) before anything is written.
    """
    address = check_recipient(to)
    if priority not in TEST_SEND_PRIORITIES:
        raise InvalidTestSend({"priority": f"a test send is critical or high, not {priority!r}"})
    message, _ = accept_message(
        NewMessage(
            to=address,
            priority=priority,
            template=template,
            context=contact_context(contact),
            test_send_by=operator,
        ),
        api_key=None,
    )
    return message


def is_test_send(message: Message) -> bool:
    return message.test_send_by is not None
