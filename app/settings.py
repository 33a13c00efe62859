"""Service configuration: every field is a `CKPTGUARD_<NAME>` environment variable.

The README's "Configuration" table documents this class (tests/service/test_settings.py checks it);
keep the descriptions short and the defaults safe for a laptop (`ckptguard serve`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MiB = 1024 * 1024


class Settings(BaseSettings):
    """Validated service settings (prefix CKPTGUARD_)."""

    model_config = SettingsConfigDict(env_prefix="CKPTGUARD_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="address `ckptguard serve` binds")
    port: int = Field(default=8000, ge=0, le=65535, description="port `ckptguard serve` binds")
    data_dir: Path = Field(default=Path("data"), description="SQLite file and upload spool live here")
    database_url: str | None = Field(
        default=None, description="any SQLAlchemy URL; default `sqlite:///<data_dir>/ckptguard.db`")
    upload_dir: Path | None = Field(default=None,
                                    description="temp dir for uploads; default `<data_dir>/uploads`")
    max_upload_bytes: int = Field(default=4 * 1024 * MiB, gt=0, description="uploads past this get 413")
    max_body_bytes: int = Field(default=1 * MiB, gt=0,
                                description="cap on non-upload request bodies (JSON endpoints)")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="comma-separated bearer tokens; empty = no authentication")
    workers: int = Field(default_factory=lambda: max(2, os.cpu_count() or 2), ge=1, le=256,
                         description="scan worker processes; default max(2, CPUs)")
    worker_memory_mb: int = Field(default=2048, ge=64, description="RLIMIT_AS of a scan worker, MiB")
    worker_cpu_seconds: int = Field(default=120, ge=1, description="RLIMIT_CPU per scan, seconds")
    scan_timeout_seconds: float = Field(default=300.0, gt=0, description="wall-clock limit per scan")
    worker_max_scans: int = Field(default=1000, ge=1, description="recycle a worker after this many scans")
    worker_recycle_mb: int = Field(default=256, ge=1, description="recycle a worker whose resident "
                                   "memory grew by more than this many MiB in a scan (no verdict "
                                   "depends on the scans before it)")
    upload_sweep_seconds: float = Field(default=600.0, gt=0, description="how often spool files "
                                        "left by a killed server are looked for (older than an hour)")
    max_uploads_in_flight: int = Field(
        default=64, ge=1, description="uploads being received at once; past it: 503 + Retry-After "
        "(each holds a connection and a spool file)")
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, description="a connection's request line and headers must arrive within "
        "this, or 408 and the connection is closed")
    body_timeout_seconds: float = Field(default=30.0, gt=0, description="a JSON request body "
                                        "(not an upload) must arrive within this, or 408")
    retention_days: float = Field(default=0.0, ge=0, description="scans older than this many days "
                                  "are deleted (with analyses no other scan references); 0 = keep "
                                  "for ever")
    retention_sweep_seconds: float = Field(default=3600.0, gt=0,
                                           description="how often retention_days is applied")
    max_url_scans_in_flight: int | None = Field(
        default=None, ge=1, description="URL scans running at once; past it: 503 + Retry-After; "
        "default max(1, workers // 2), so uploads keep being scanned while a slow upstream holds "
        "URL scans")
    max_in_flight_per_key: int = Field(
        default=16, ge=1, description="with API keys set: uploads being received plus URL scans "
        "running for one key; past it: 503 KEY_BUSY + Retry-After")
    upload_min_rate: int = Field(default=16 * 1024, ge=1, description="bytes/s an upload must average "
                                 "after upload_grace_seconds, or it is cut with 408")
    upload_grace_seconds: float = Field(default=30.0, gt=0, description="before the upload rate counts")
    max_queued_scans: int = Field(
        default=128, ge=0,
        description="upload / URL scans that may wait for a busy pool; past it: 503 + Retry-After")
    allow_globals: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="comma-separated extra allowlisted globals (like add_safe_globals); in the cache key")
    log_level: str = Field(default="INFO", description="root log level; logs are JSON lines on stderr")
    test_hooks: bool = Field(default=False, description="tests only: honour the X-Ckptguard-Test-Hook header")
    # --- model-hub webhook (app/hub*.py, README "Model-hub webhook") ---
    hub_endpoint: str = Field(default="https://huggingface.co",
                              description="model hub base URL (like HF_ENDPOINT)")
    hub_token: str | None = Field(default=None,
                                  description="hub token for private repos (sent to the hub only)")
    webhook_secret: str | None = Field(
        default=None, description="the hub webhook's secret (X-Webhook-Secret); unset = webhook off (503)")
    notify_url: str | None = Field(default=None, description="POST each finished revision summary here")
    notify_secret: str | None = Field(default=None,
                                      description="HMAC-SHA256 key for the notification signature")
    notify_retries: int = Field(default=3, ge=0, le=20, description="extra notification attempts")
    notify_timeout_seconds: float = Field(default=10.0, gt=0, le=300,
                                          description="one notification attempt's limit")
    hub_scan_attempts: int = Field(default=3, ge=1, le=20, description="tries per file (and tree listing)")
    hub_retry_backoff_seconds: float = Field(default=2.0, ge=0,
                                             description="first retry delay, doubled each time")
    hub_lease_seconds: float = Field(default=60.0, gt=0, description="SQLite: a running hub job not "
                                     "renewed for this long is resumed")
    hub_concurrency: int = Field(default=2, ge=1, le=64, description="files of a revision scanned at "
                                 "once (in-process queue, SQLite)")
    # --- the job tier (app/jobqueue.py; on PostgreSQL procrastinate, app/hub/tasks.py) ---
    worker_concurrency: int = Field(default=2, ge=1, le=256, description="PostgreSQL: jobs one "
                                    "`ckptguard worker` (or `serve`) runs at once")
    worker_shutdown_seconds: float = Field(default=30.0, ge=0, description="PostgreSQL: on SIGTERM a "
                                           "worker finishes its jobs for this long, then hands them back")
    queue_heartbeat_seconds: float = Field(default=10.0, gt=0,
                                           description="PostgreSQL: how often a worker says it is alive")
    queue_stalled_seconds: float = Field(default=30.0, gt=0, description="PostgreSQL: the jobs of a worker "
                                         "silent this long are queued again")
    queue_recover_seconds: float = Field(default=15.0, gt=0, description="PostgreSQL: how often stalled "
                                         "jobs are looked for (whole seconds; at least every minute)")
    reconcile_cron: str | None = Field(default=None, description="PostgreSQL: cron expression (5 fields, "
                                       "optional 6th for seconds) of the periodic reconcile of every "
                                       "known branch; unset = off")
    hub_max_files: int = Field(default=10000, ge=1, description="files listed per revision, at most")
    url_allow_private: bool = Field(default=False,
                                    description="URL scans may reach private addresses (app/ssrf.py)")
    url_allowlist: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="comma-separated CIDRs/hosts URL scans may reach though private")

    @field_validator("api_keys", "allow_globals", "url_allowlist", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if any(len(k) < 16 for k in self.api_keys):
            raise ValueError("CKPTGUARD_API_KEYS: each key needs at least 16 characters")
        return self

    @field_validator("reconcile_cron")
    @classmethod
    def _check_cron(cls, value: str | None) -> str | None:
        if value:
            import croniter

            if not croniter.croniter.is_valid(value):
                raise ValueError(f"CKPTGUARD_RECONCILE_CRON: {value!r} is not a cron expression")
        return value or None

    @property
    def distributed(self) -> bool:
        """PostgreSQL: the job tier runs on procrastinate (workers anywhere); else in-process."""
        return self.resolved_database_url.startswith(("postgresql", "postgres"))

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'ckptguard.db').resolve()}"

    @property
    def resolved_upload_dir(self) -> Path:
        return (self.upload_dir or self.data_dir / "uploads").resolve()

    @property
    def resolved_max_url_scans_in_flight(self) -> int:
        return self.max_url_scans_in_flight or max(1, self.workers // 2)
