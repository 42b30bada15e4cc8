"""Prometheus metrics every service exposes: one registry per app (two apps in one process, as in tests, never share
counters), its requests by route, method and status and their latency (prometheus-fastapi-instrumentator), and its
active-version gauge; a service subclass adds its own."""

from __future__ import annotations

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator import metrics as http_metrics

# From a health check (milliseconds) to an agent query that searches several times (minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class ServiceMetrics:
    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        self.active_version = Gauge(
            f"bridge_{service}_active_version_info", "1 for the active version", ["version"], registry=self.registry
        )
        self.checkpoint_fallback = Gauge(
            f"bridge_{service}_checkpoint_fallback",
            "1 when start could not load the recorded active version and serves an earlier one (see /readyz)",
            registry=self.registry,
        )

    def instrument(self, app: FastAPI) -> None:
        """Adds the middleware that counts and times every request: `bridge_<service>_requests_total` and
        `bridge_<service>_request_duration_seconds`, labelled by `handler` (the route's template, `none` when no
        route matched), `method` and `status` (the exact code). The last middleware added is the outermost."""
        Instrumentator(should_group_status_codes=False, registry=self.registry).add(
            http_metrics.requests(metric_name=f"bridge_{self.service}_requests_total", metric_doc="HTTP requests",
                                  registry=self.registry),
            http_metrics.latency(metric_name=f"bridge_{self.service}_request_duration_seconds",
                                 metric_doc="HTTP request latency, to the last byte of the response",
                                 buckets=LATENCY_BUCKETS, registry=self.registry),
        ).instrument(app)  # fmt: skip

    def exposition(self, active_version: str, fallback: str | None = None) -> Response:
        """`GET /metrics`: the text format, with the active version's gauge set (and the start fallback's)."""
        self.active_version.clear()
        self.active_version.labels(active_version).set(1)
        self.checkpoint_fallback.set(fallback is not None)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
