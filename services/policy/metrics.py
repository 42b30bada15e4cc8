from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class PolicyMetrics:
    """One registry per app, so two apps in one process (tests) never share counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "bridge_policy_requests_total", "HTTP requests", ["route", "status"], registry=self.registry
        )
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
        self.active_version = Gauge(
            "bridge_policy_active_version_info", "1 for the active version", ["version"], registry=self.registry
        )
