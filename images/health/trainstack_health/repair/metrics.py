"""The repair controller's counters (contract.METRICS `trainstack_node_repair*`). The store and
the /metrics and /healthz server are the agent's (trainstack_health.metrics); the two programs
run in different pods, so each exposes only its own names."""

from __future__ import annotations

from trainstack_health import metrics
from trainstack_health.metrics import serve

__all__ = ["ERRORS", "NAMES", "REPAIRS", "Metrics", "serve"]

REPAIRS = "trainstack_node_repairs_total"
ERRORS = "trainstack_node_repair_errors_total"
NAMES = (REPAIRS, ERRORS)


class Metrics(metrics.Metrics):
    def __init__(self) -> None:
        super().__init__(NAMES)

    def value(self, name: str, /, **labels: str) -> float:
        """A counter never incremented reads 0, as Prometheus would show it."""
        return super().value(name, **labels) or 0.0
