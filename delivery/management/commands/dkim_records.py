"""Print the DNS TXT record each configured DKIM key needs (docs/delivery.md, "DKIM")."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from delivery.exceptions import ProviderConfigurationError
from delivery.providers.dkim import DkimSigner


class Command(BaseCommand):
    help = (
        "Print, for every key in EMAILHUB_DKIM_KEYS, the TXT record to publish: "
        '`<selector>._domainkey.<domain>. TXT "v=DKIM1; k=…; p=…"`.'
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            signer = DkimSigner.from_setting(settings.EMAILHUB_DKIM_KEYS)
        except ProviderConfigurationError as exc:
            raise CommandError(str(exc)) from None
        if not signer.domains:
            raise CommandError("EMAILHUB_DKIM_KEYS is empty: no mail is DKIM-signed (docs/delivery.md, DKIM)")
        for domain in signer.domains:
            for key in signer.keys_for(domain):
                self.stdout.write(f'{key.dns_name()}. TXT "{key.dns_record()}"  ; {key.algorithm}')
