"""Outcomes fault and unsafe count as failures (the partial index of recent failures covers
them); config_runs.starts counts the worker processes that began a config

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

# Written out, not imported: a migration keeps the schema of its own date.
FAILING_SQL = "outcome IN ('fail', 'nan', 'fault', 'unsafe', 'error', 'timeout', 'oom')"
FAILING_SQL_0002 = "outcome IN ('fail', 'nan', 'error', 'timeout', 'oom')"


def _recreate(where: str) -> None:
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_config_runs_failures_recent')
        batch_op.create_index(
            'ix_config_runs_failures_recent', ['finished_at', 'id'], unique=False,
            postgresql_where=sa.text(where), sqlite_where=sa.text(where),
        )


def upgrade() -> None:
    _recreate(FAILING_SQL)
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('starts', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.drop_column('starts')
    _recreate(FAILING_SQL_0002)
