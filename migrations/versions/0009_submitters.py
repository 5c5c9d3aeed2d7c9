"""Who asked: the name of the API token that submitted each sweep and bisection (never its
secret), "webhook" for a CI delivery; null where authentication was off or for older rows

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sweeps') as batch:
        batch.add_column(sa.Column('submitted_by', sa.String(length=64), nullable=True))
    with op.batch_alter_table('bisections') as batch:
        batch.add_column(sa.Column('submitted_by', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('bisections') as batch:
        batch.drop_column('submitted_by')
    with op.batch_alter_table('sweeps') as batch:
        batch.drop_column('submitted_by')
