"""CI integration: source bundles, webhook deliveries, the revision a sweep tests

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('source_bundles',
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.Column('files', sa.JSON(), nullable=False),
    sa.Column('size_bytes', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.PrimaryKeyConstraint('hash')
    )

    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('repository', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('ref', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('commit_sha', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('event', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('base_ref', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('pr_number', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('source_hash', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_sweeps_commit_sha'), ['commit_sha'], unique=False)
        batch_op.create_index(batch_op.f('ix_sweeps_source_hash'), ['source_hash'], unique=False)
        batch_op.create_index('ix_sweeps_repository_ref', ['repository', 'ref', 'status'], unique=False)
        batch_op.create_foreign_key('fk_sweeps_source_hash_source_bundles', 'source_bundles', ['source_hash'], ['hash'],
                                    ondelete='RESTRICT')

    op.create_table('ci_deliveries',
    sa.Column('delivery_id', sa.String(length=100), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('sweep_id', sa.Integer(), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('delivery_id')
    )
    with op.batch_alter_table('ci_deliveries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ci_deliveries_sweep_id'), ['sweep_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('ci_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ci_deliveries_sweep_id'))
    op.drop_table('ci_deliveries')

    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_constraint('fk_sweeps_source_hash_source_bundles', type_='foreignkey')
        batch_op.drop_index('ix_sweeps_repository_ref')
        batch_op.drop_index(batch_op.f('ix_sweeps_source_hash'))
        batch_op.drop_index(batch_op.f('ix_sweeps_commit_sha'))
        batch_op.drop_column('source_hash')
        batch_op.drop_column('pr_number')
        batch_op.drop_column('base_ref')
        batch_op.drop_column('event')
        batch_op.drop_column('commit_sha')
        batch_op.drop_column('ref')
        batch_op.drop_column('repository')

    op.drop_table('source_bundles')
