"""Bisections: the first bad commit of a kernel repository for given configs, asked through the
API or started for each bug (cluster) of a CI push's new failures

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'bisections',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('repo', sa.String(length=1000), nullable=False),
        sa.Column('good', sa.String(length=255), nullable=False),
        sa.Column('bad', sa.String(length=255), nullable=False),
        sa.Column('backend', sa.String(length=16), nullable=False),
        sa.Column('configs', sa.JSON(), nullable=False),
        sa.Column('defects', sa.JSON(), nullable=False),
        sa.Column('err_ratio_gate', sa.Float(), nullable=True),
        sa.Column('first_bad', sa.String(length=64), nullable=True),
        sa.Column('steps', sa.Integer(), nullable=True),
        sa.Column('skipped', sa.JSON(), nullable=True),
        sa.Column('tested', sa.JSON(), nullable=True),
        sa.Column('candidates', sa.JSON(), nullable=True),
        sa.Column('runs', sa.Integer(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('repository', sa.String(length=200), nullable=True),
        sa.Column('commit_sha', sa.String(length=64), nullable=True),
        sa.Column('sweep_id', sa.Integer(), nullable=True),
        sa.Column('cluster_rank', sa.Integer(), nullable=True),
        sa.Column('cluster_signature', sa.String(length=200), nullable=True),
        sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('sweep_id', 'cluster_rank', name='uq_bisections_sweep_cluster'),
    )
    op.create_index(op.f('ix_bisections_status'), 'bisections', ['status'], unique=False)
    op.create_index(op.f('ix_bisections_commit_sha'), 'bisections', ['commit_sha'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_bisections_commit_sha'), table_name='bisections')
    op.drop_index(op.f('ix_bisections_status'), table_name='bisections')
    op.drop_table('bisections')
