"""Triage: a sweep's failures as clusters (one per bug) and the state of its triage

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'sweep_triage',
        sa.Column('sweep_id', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('runs', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('sweep_id'),
    )
    op.create_index(op.f('ix_sweep_triage_status'), 'sweep_triage', ['status'], unique=False)

    op.create_table(
        'clusters',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('sweep_id', sa.Integer(), nullable=False),
        sa.Column('rank', sa.Integer(), nullable=False),
        sa.Column('signature', sa.String(length=200), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('signatures', sa.JSON(), nullable=False),
        sa.Column('explanation', sa.JSON(), nullable=False),
        sa.Column('config_hashes', sa.JSON(), nullable=False),
        sa.Column('example_config', sa.JSON(), nullable=False),
        sa.Column('minimal_config', sa.JSON(), nullable=True),
        sa.Column('reproducer', sa.Text(), nullable=True),
        sa.Column('classification', sa.String(length=32), nullable=True),
        sa.Column('classification_detail', sa.JSON(), nullable=True),
        sa.Column('first_bad_commit', sa.String(length=64), nullable=True),
        sa.Column('runs', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('sweep_id', 'signature', name='uq_clusters_sweep_signature'),
    )
    op.create_index(op.f('ix_clusters_sweep_id'), 'clusters', ['sweep_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_clusters_sweep_id'), table_name='clusters')
    op.drop_table('clusters')
    op.drop_index(op.f('ix_sweep_triage_status'), table_name='sweep_triage')
    op.drop_table('sweep_triage')
