"""The health body: one line per dependency."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    database: str
    broker: str
