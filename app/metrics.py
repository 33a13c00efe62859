"""Prometheus metrics, one registry per app (so tests can run several apps side by side)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from ckptguard.app.jobqueue import QueueStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The service's metrics; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.scans = Counter("ckptguard_scans", "Scans answered, by verdict, format and cache hit",
                             ["verdict", "format", "cached"], registry=self.registry)
        self.duration = Histogram(
            "ckptguard_scan_duration_seconds", "Wall time of a scan in a worker (cache misses)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry)
        self.bytes_read = Counter("ckptguard_scan_bytes_read", "Bytes the scanner read from inputs",
                                  registry=self.registry)
        self.upload_bytes = Counter("ckptguard_upload_bytes", "Bytes received in uploads",
                                    registry=self.registry)
        self.restarts = Counter("ckptguard_worker_restarts", "Scan workers replaced, by reason",
                                ["reason"], registry=self.registry)
        self.queue_depth = Gauge("ckptguard_queue_depth", "Scans waiting for a free worker",
                                 registry=self.registry)
        self.busy = Gauge("ckptguard_workers_busy", "Workers running a scan", registry=self.registry)
        self.rejected = Counter("ckptguard_scans_rejected", "Scan requests refused: queue full",
                                registry=self.registry)
        self.hub_webhooks = Counter("ckptguard_hub_webhooks", "Hub webhook deliveries, by outcome",
                                    ["outcome"], registry=self.registry)
        self.hub_revisions = Counter("ckptguard_hub_revisions", "Hub revisions finished, by state",
                                     ["state"], registry=self.registry)
        self.hub_files = Counter("ckptguard_hub_files",
                                 "Hub files finished, by state and whether a stored report was reused",
                                 ["state", "reused"], registry=self.registry)

        # the job tier (app/jobqueue.py), per queue; totals kept by the database
        self.jobs_queued = Gauge("ckptguard_jobs_queued", "Jobs waiting in the job tier, by queue",
                                 ["queue"], registry=self.registry)
        self.jobs_running = Gauge("ckptguard_jobs_running", "Jobs running in the job tier, by queue",
                                  ["queue"], registry=self.registry)
        self.job_retries = Gauge("ckptguard_job_retries", "Retries the job tier scheduled, by queue",
                                 ["queue"], registry=self.registry)
        self.job_recoveries = Gauge("ckptguard_job_stalled_recoveries",
                                    "Jobs of dead workers queued again, by queue",
                                    ["queue"], registry=self.registry)
        self._queue_stats: Callable[[], Awaitable[list[QueueStats]]] | None = None

    def watch_pool(self, depth: Callable[[], float], busy: Callable[[], float]) -> None:
        self.queue_depth.set_function(depth)
        self.busy.set_function(busy)

    def watch_queues(self, stats: Callable[[], Awaitable[list[QueueStats]]]) -> None:
        """The job tier's figures, read from the database when /metrics is rendered."""
        self._queue_stats = stats

    async def refresh(self) -> None:
        """Before rendering: the job tier's figures (shared by every node: from the database)."""
        if self._queue_stats is None:
            return
        for s in await self._queue_stats():
            self.jobs_queued.labels(queue=s.queue).set(s.queued)
            self.jobs_running.labels(queue=s.queue).set(s.running)
            self.job_retries.labels(queue=s.queue).set(s.retries)
            self.job_recoveries.labels(queue=s.queue).set(s.stalled_recoveries)

    def restarted(self, reason: str) -> None:
        self.restarts.labels(reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
