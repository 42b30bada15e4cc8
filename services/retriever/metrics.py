from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RetrieverMetrics:
    """One registry per app, so two apps in one process (tests) never share counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "bridge_retriever_requests_total", "HTTP requests", ["route", "status"], registry=self.registry
        )
        self.search_seconds = Histogram(
            "bridge_retriever_search_seconds", "Search latency", ["mode"], registry=self.registry
        )
        self.queries = Counter("bridge_retriever_queries_total", "Queries searched", registry=self.registry)
        self.documents = Gauge(
            "bridge_retriever_documents", "Documents in the serving collection", registry=self.registry
        )
        self.active_version = Gauge(
            "bridge_retriever_active_version_info",
            "1 for the active version",
            ["version"],
            registry=self.registry,
        )
