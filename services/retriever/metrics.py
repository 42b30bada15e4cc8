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
        # How many concurrent searches share one encoder forward: the micro-batcher's whole point, and the first
        # thing to read when queries/s falls short of the encoder's batched speed.
        self.batch_queries = Histogram(
            "bridge_retriever_batch_queries",
            "Queries per micro-batch (one encoder forward for all)",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256, 512),
            registry=self.registry,
        )
        self.documents = Gauge(
            "bridge_retriever_documents", "Documents in the serving collection", registry=self.registry
        )
