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
