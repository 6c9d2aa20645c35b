"""Outbound event webhooks: the application's endpoints, the deliveries of events to them, and
every attempt (issue 22). The events themselves are written by the statements that cause them
(core.outbound_events); this app dispatches them to endpoints and delivers them, signed the
Standard Webhooks way, retried on a schedule, with a log of every attempt."""
