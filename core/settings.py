"""One settings object, read from ATTNSWEEP_* environment variables when first asked for."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE = "sqlite:///attnsweep.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSWEEP_", extra="ignore")

    database_url: str = DEFAULT_SQLITE
    broker_url: str = "redis://127.0.0.1:6379/0"
    # Comma-separated bearer tokens for POST endpoints; empty means writes are open.
    api_tokens: str = ""
    kernel_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "attnsweep" / "kernels")
    config_time_limit_s: float = 120.0

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if not v.startswith(("sqlite", "postgresql", "postgres")):
            raise ValueError(f"database_url={v!r}: must be a sqlite:/// or postgresql:// URL")
        return v

    @property
    def tokens(self) -> set[str]:
        return {t.strip() for t in self.api_tokens.split(",") if t.strip()}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
