"""Prometheus metrics every service exposes: one registry per app (two apps in one process, as in tests, never share
counters), its request counter and its active-version gauge; a service subclass adds its own."""

from __future__ import annotations

from fastapi import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest


class ServiceMetrics:
    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            f"bridge_{service}_requests_total", "HTTP requests", ["route", "status"], registry=self.registry
        )
        self.active_version = Gauge(
            f"bridge_{service}_active_version_info", "1 for the active version", ["version"], registry=self.registry
        )

    def exposition(self, active_version: str) -> Response:
        """`GET /metrics`: the text format, with the active version's gauge set."""
        self.active_version.clear()
        self.active_version.labels(active_version).set(1)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
