from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import ServiceMetrics


class RetrieverMetrics(ServiceMetrics):
    def __init__(self) -> None:
        super().__init__("retriever")
        self.search_seconds = Histogram(
            "bridge_retriever_search_seconds", "Search latency", ["mode"], registry=self.registry
        )
        self.queries = Counter("bridge_retriever_queries_total", "Queries searched", registry=self.registry)
        self.documents = Gauge(
            "bridge_retriever_documents", "Documents in the serving collection", registry=self.registry
        )
