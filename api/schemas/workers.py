"""Worker bodies: what each registered worker reported, and whether it is alive."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class WorkerPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    queue: str
    backend: str
    gpu: int | None
    concurrency: int
    device: str | None
    total_memory: int | None = Field(description="bytes; null without a GPU")
    driver_version: str | None
    compiler_version: str | None
    arch: str | None
    versions: dict[str, Any]
    hostname: str
    pid: int
    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    alive: bool = Field(description="not stopped, and a heartbeat within ATTNSWEEP_WORKER_STALE_S")


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    count: int
