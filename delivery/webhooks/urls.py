from django.urls import path

from delivery.webhooks.views import WebhookView

urlpatterns = [
    path("webhooks/<str:provider>", WebhookView.as_view(), name="webhook"),
]
