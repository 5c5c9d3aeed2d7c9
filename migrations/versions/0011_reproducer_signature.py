"""What a cluster's reproducer gave when the triage ran it after making it (outcome/gate/location)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('clusters') as batch:
        batch.add_column(sa.Column('reproducer_signature', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('clusters') as batch:
        batch.drop_column('reproducer_signature')
