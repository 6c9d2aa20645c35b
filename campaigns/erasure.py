"""Erasing a contact: its personal data goes, the record that mail was sent to it stays.

"Deleting" a contact (admin, API) anonymises it instead of removing the row:

- the address becomes `erased-<id>@invalid` (`.invalid` is reserved by RFC 2606 and can never be
  delivered; the id keeps it unique), name and attributes are cleared, the timezone reset;
- its list memberships are removed and its status is no longer `active`, so no campaign,
  present or future, reaches it (fan-out joins only active list members);
- `anonymised_at` is set;
- its messages keep the contact id, status, timestamps and provider ids, but their `to_email`
  becomes the same placeholder and their content and event payloads are cleared
  (delivery.services.operator.erase_address); unsent ones are cancelled.

The suppression list is left alone: an unsubscribe must keep being honoured if the address is
imported again (operators can delete the suppression when an erasure request requires it).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from campaigns.models import Contact, ListMembership
from delivery.services.operator import erase_address


def placeholder_for(contact_id: int) -> str:
    return f"erased-{contact_id}@invalid"


def erase_contacts(contact_ids: Sequence[int]) -> int:
    """Anonymise these contacts (those not anonymised yet); return how many were erased."""
    erased = 0
    for contact_id in sorted(set(contact_ids)):
        with transaction.atomic():
            # Locked, so an import or API edit that wrote the address back meanwhile waits for us.
            contact = Contact.objects.select_for_update().filter(pk=contact_id, anonymised_at=None).first()
            if contact is None:
                continue
            placeholder = placeholder_for(contact.pk)
            erase_address(contact.email, placeholder)
            ListMembership.objects.filter(contact_id=contact.pk).delete()
            Contact.objects.filter(pk=contact.pk).update(
                email=placeholder,
                name="",
                attributes={},
                timezone="UTC",
                # Contact.Status has no "erased" value (adding one is a migration); any status
                # but `active` keeps fan-out away, and anonymised_at says why.
                status=Contact.Status.UNSUBSCRIBED,
                anonymised_at=timezone.now(),
                updated_at=timezone.now(),
            )
            erased += 1
    return erased
