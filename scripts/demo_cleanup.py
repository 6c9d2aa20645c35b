"""What `make demo` does last: leave nothing in its database that a later process would act on.

The demo runs on a database of its own (emailhub_demo), yet a beat or scheduler started on it
later must find no work the demo left: its every-minute recurring schedule would mail the demo's
contacts each minute, a campaign or message still pending would be sent. Everything goes through
the owning app's services (scheduling.recurring, campaigns.lifecycle, delivery's operator
actions), as the admin's actions do. Kept apart from scripts/demo.py, which sets up Django and
the demo's environment when imported, so that tests can call it on the test database.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from campaigns import lifecycle
from campaigns.exceptions import CampaignStateError
from campaigns.models import Campaign
from delivery.models import Message, MessageStatus
from delivery.services.operator import cancel_messages
from scheduling import recurring
from scheduling.models import RecurringSchedule

UNFINISHED_CAMPAIGNS = (Campaign.Status.SCHEDULED, Campaign.Status.SENDING, Campaign.Status.PAUSED)
PENDING_MESSAGES = (MessageStatus.SCHEDULED, MessageStatus.QUEUED, MessageStatus.RETRY_WAIT)


@dataclass
class Retired:
    schedules: list[int] = field(default_factory=list)
    campaigns: list[int] = field(default_factory=list)
    messages: list[int] = field(default_factory=list)


def retire_demo_work() -> Retired:
    """Deactivate every recurring schedule, cancel every unfinished campaign and pending message.

    Only for the demo's own database: it stops everything in it, this run's and any earlier,
    interrupted run's. Recurring schedules are deactivated, not deleted (the campaigns they
    created keep naming them). Beat's own housekeeping tasks (emailhub/periodic.py) stay: they
    act only on work that exists, and there is none left.
    """
    retired = Retired()
    for schedule_id in RecurringSchedule.objects.filter(active=True).values_list("pk", flat=True):
        recurring.update_schedule(schedule_id, {"active": False})
        retired.schedules.append(schedule_id)
    for campaign_id in Campaign.objects.filter(status__in=UNFINISHED_CAMPAIGNS).values_list("pk", flat=True):
        try:
            lifecycle.cancel(campaign_id)
        except CampaignStateError:  # it finished in the meantime
            continue
        retired.campaigns.append(campaign_id)
    pending = list(Message.objects.filter(status__in=PENDING_MESSAGES).values_list("pk", flat=True))
    retired.messages = cancel_messages(pending, reason="the demo ended").moved
    return retired
