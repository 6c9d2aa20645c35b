from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from campaigns.views import unsubscribe_view
from core.admin import operator_timezone_view
from core.health import healthz, readyz
from core.metrics import metrics_view
from delivery.admin import provider_health_view
from delivery.tracking import views as tracking_views
from operations.dashboard import dashboard_data_view, dashboard_view

# The admin is emailhub's, and its "View site" link goes somewhere real: the API's docs.
admin.site.site_header = "emailhub"
admin.site.site_title = "emailhub"
admin.site.index_title = "Operations"
admin.site.site_url = "/api/docs/"


urlpatterns = [
    path("admin/providers/", admin.site.admin_view(provider_health_view), name="admin-provider-health"),
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="admin-dashboard"),
    path("admin/dashboard/data/", admin.site.admin_view(dashboard_data_view), name="admin-dashboard-data"),
    path("admin/timezone/", admin.site.admin_view(operator_timezone_view), name="admin-timezone"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("delivery.api.urls")),
    path("api/v1/", include("campaigns.api.urls")),
    path("api/v1/", include("scheduling.api")),
    path("api/v1/", include("delivery.webhooks.urls")),
    path("api/v1/", include("outbound.api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI and Redoc from our own /static/ (SPECTACULAR_SETTINGS "SIDECAR"); the Redoc page
    # is drf-spectacular's without its Google Fonts links (api_docs/redoc.html).
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path(
        "api/redoc/",
        SpectacularRedocView.as_view(url_name="schema", template_name="api_docs/redoc.html"),
        name="api-redoc",
    ),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    # Prometheus: top level, not under /api/ (no API key: an address allow-list or its token).
    path("metrics", metrics_view, name="metrics"),
    # RFC 8058 one-click unsubscribe: top level, not under /api/ (no key, no JSON).
    path("u/<str:token>", unsubscribe_view, name="unsubscribe"),
    # Open pixel and tracked links (delivery/tracking/): top level, no key, no database.
    path("t/o/<str:token>", tracking_views.open_pixel, name="tracking-open"),
    path("t/c/<str:token>", tracking_views.click, name="tracking-click"),
]
