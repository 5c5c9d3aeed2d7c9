"""The config model: the vocabulary every layer shares. Imports nothing of the project."""
from attnconfig.config import (
    DTYPES,
    MAX_HEAD_DIM,
    AttentionConfig,
    ConfigError,
    parse_config,
    validation_problems,
)

__all__ = ["DTYPES", "MAX_HEAD_DIM", "AttentionConfig", "ConfigError", "parse_config", "validation_problems"]
