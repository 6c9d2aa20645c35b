from django.urls import path

from delivery.api.views import MessageDetailView, MessageListView, ProviderHealthView

urlpatterns = [
    path("messages", MessageListView.as_view(), name="message-list"),
    path("messages/<int:message_id>", MessageDetailView.as_view(), name="message-detail"),
    path("providers", ProviderHealthView.as_view(), name="provider-health"),
]
