"""Serializers that document responses the selectors build as plain dicts (provider health, a
webhook's answer): the OpenAPI schema types them instead of calling them free-form objects.
They never validate or render anything; a test checks real responses against the schema."""

from __future__ import annotations

from rest_framework import serializers

from core import api_input


class CircuitSerializer(api_input.Serializer):
    """delivery.breakers.snapshot: the circuit breaker of a provider endpoint, shared by every worker."""

    state = serializers.ChoiceField(choices=["closed", "open", "half-open"])
    fail_counter = serializers.IntegerField()
    fail_max = serializers.IntegerField()
    reset_timeout = serializers.FloatField(help_text="seconds an open circuit stays open")
    opened_at = serializers.DateTimeField(allow_null=True)
    failures_total = serializers.IntegerField()
    times_opened = serializers.IntegerField()
    last_error = serializers.CharField(allow_null=True)
    last_error_at = serializers.FloatField(allow_null=True, help_text="Unix time")
    last_state_change = serializers.CharField(allow_null=True)


class RateLimitSerializer(api_input.Serializer):
    per_second = serializers.FloatField()
    tokens = serializers.FloatField(allow_null=True, help_text="null when Redis cannot be read")
    reserved_for_transactional = serializers.FloatField()


class ProviderSerializer(api_input.Serializer):
    """One circuit: a provider at one endpoint (a provider name whose processes point at two
    servers has two entries)."""

    name = serializers.CharField()
    endpoint = serializers.CharField(
        allow_blank=True,
        help_text="the server this circuit sends to, without credentials (SMTP host:port, the SES or "
        "SendGrid API URL); empty for a provider with one endpoint",
    )
    pools = serializers.ListField(
        child=serializers.ChoiceField(choices=["transactional", "bulk"]),
        help_text="the pools whose workers sent through this circuit in the last day (before any "
        "did: the pools whose chain names the provider)",
    )
    position = serializers.DictField(child=serializers.IntegerField(), help_text="1-based, by pool")
    circuit = CircuitSerializer()
    rate_limit = RateLimitSerializer(
        allow_null=True, help_text="this endpoint's bucket; null when the provider has no quota set"
    )


class ChainsSerializer(api_input.Serializer):
    transactional = serializers.ListField(child=serializers.CharField())
    bulk = serializers.ListField(child=serializers.CharField())


class ProviderHealthSerializer(api_input.Serializer):
    chains = ChainsSerializer(help_text="each pool's providers in failover order")
    providers = ProviderSerializer(
        many=True, help_text="one entry per circuit: each provider at each endpoint"
    )


class WebhookResultSerializer(api_input.Serializer):
    """What a webhook tells the provider it did (delivery.webhooks.base.answer and the
    providers' `acknowledge`); which keys appear depends on the provider and the message."""

    received = serializers.IntegerField(required=False)
    new = serializers.IntegerField(required=False)
    duplicates = serializers.IntegerField(required=False)
    suppressed = serializers.IntegerField(required=False)
    unmatched = serializers.IntegerField(required=False)
    skipped = serializers.IntegerField(
        required=False,
        help_text="events of this authentic request left out because they cannot be used (not an "
        "object, a field missing, no address, an address over 254 characters, data PostgreSQL "
        "cannot store); each is logged and counted in emailhub_webhook_events_skipped_total, "
        "and the others are recorded",
    )
    ignored = serializers.IntegerField(
        required=False, help_text="SendGrid: events of a type not recorded on purpose (processed, …)"
    )
    confirmed = serializers.CharField(required=False, help_text="SNS: the subscription confirmed")
    unsubscribed = serializers.CharField(required=False, help_text="SNS: the topic that unsubscribed us")
