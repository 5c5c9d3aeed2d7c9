"""The kernel under test: which kernel a sweep asked for (`--kernel`, "attnsweep" for the rows
before), the name and version it ran as, and the same on every result

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sweeps') as batch:
        batch.add_column(sa.Column('kernel', sa.String(length=1000), nullable=False, server_default='attnsweep'))
        batch.add_column(sa.Column('kernel_name', sa.String(length=200), nullable=True))
        batch.add_column(sa.Column('kernel_version', sa.String(length=64), nullable=True))
    with op.batch_alter_table('config_runs') as batch:
        batch.add_column(sa.Column('kernel', sa.String(length=200), nullable=True))
        batch.add_column(sa.Column('kernel_version', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('config_runs') as batch:
        batch.drop_column('kernel_version')
        batch.drop_column('kernel')
    with op.batch_alter_table('sweeps') as batch:
        batch.drop_column('kernel_version')
        batch.drop_column('kernel_name')
        batch.drop_column('kernel')
