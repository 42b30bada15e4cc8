from __future__ import annotations

from prometheus_client import Counter, Histogram

from services.common.metrics import ServiceMetrics


class PolicyMetrics(ServiceMetrics):
    def __init__(self) -> None:
        super().__init__("policy")
        self.query_seconds = Histogram(
            "bridge_policy_query_seconds", "Agent query latency", registry=self.registry,
            buckets=(0.5, 1, 2, 5, 10, 20, 40, 80, 160),
        )  # fmt: skip
        self.trajectories = Counter(
            "bridge_policy_trajectories_total", "Trajectories logged", ["kind"], registry=self.registry
        )
        self.reward = Histogram(
            "bridge_policy_rollout_reward", "Rollout rewards", registry=self.registry, buckets=(0.0, 0.5, 1.0)
        )
        self.stream_needed_trimmed = Counter(
            "bridge_policy_stream_needed_trimmed_total",
            "Stream entries a training run still needed, trimmed over stream_hard_maxlen",
            ["stream"],
            registry=self.registry,
        )

    def count_needed_trimmed(self, stream: str, count: int) -> None:
        self.stream_needed_trimmed.labels(stream=stream).inc(count)
