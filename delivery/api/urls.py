from django.urls import path

from delivery.api.batch import MessageBatchView
from delivery.api.views import (
    EventListView,
    MessageCancelCarryingView,
    MessageCancelView,
    MessageDetailView,
    MessageEventsView,
    MessageListView,
    ProviderHealthView,
)

urlpatterns = [
    path("messages", MessageListView.as_view(), name="message-list"),
    path("messages/batch", MessageBatchView.as_view(), name="message-batch"),
    path("messages/cancel", MessageCancelCarryingView.as_view(), name="message-cancel-carrying"),
    path("messages/<int:message_id>", MessageDetailView.as_view(), name="message-detail"),
    path("messages/<int:message_id>/cancel", MessageCancelView.as_view(), name="message-cancel"),
    path("messages/<int:message_id>/events", MessageEventsView.as_view(), name="message-events"),
    path("events", EventListView.as_view(), name="event-list"),
    path("providers", ProviderHealthView.as_view(), name="provider-health"),
]
