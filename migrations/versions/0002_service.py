"""service mode: workers table, sweep queue and rerun link, failure-query indexes

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

# Kept literal (not imported from the models): a revision must not change when the code does.
FAILING_SQL = "outcome IN ('fail', 'nan', 'error', 'timeout', 'oom')"


def upgrade() -> None:
    op.create_table('workers',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('queue', sa.String(length=64), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('gpu', sa.Integer(), nullable=True),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('device', sa.String(length=200), nullable=True),
    sa.Column('total_memory', sa.BigInteger(), nullable=True),
    sa.Column('driver_version', sa.String(length=64), nullable=True),
    sa.Column('compiler_version', sa.String(length=64), nullable=True),
    sa.Column('arch', sa.String(length=64), nullable=True),
    sa.Column('versions', sa.JSON(), nullable=False),
    sa.Column('hostname', sa.String(length=200), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('last_heartbeat', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('name')
    )
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_workers_queue'), ['queue'], unique=False)
        batch_op.create_index(batch_op.f('ix_workers_last_heartbeat'), ['last_heartbeat'], unique=False)

    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('queue', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('rerun_of', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_sweeps_rerun_of'), ['rerun_of'], unique=False)
        batch_op.create_foreign_key('fk_sweeps_rerun_of_sweeps', 'sweeps', ['rerun_of'], ['id'], ondelete='SET NULL')

    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.create_index('ix_config_runs_sweep_state', ['sweep_id', 'state'], unique=False)
        batch_op.create_index(
            'ix_config_runs_failures_recent', ['finished_at', 'id'], unique=False,
            postgresql_where=sa.text(FAILING_SQL), sqlite_where=sa.text(FAILING_SQL),
        )


def downgrade() -> None:
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_config_runs_failures_recent')
        batch_op.drop_index('ix_config_runs_sweep_state')

    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_constraint('fk_sweeps_rerun_of_sweeps', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_sweeps_rerun_of'))
        batch_op.drop_column('rerun_of')
        batch_op.drop_column('queue')

    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_workers_last_heartbeat'))
        batch_op.drop_index(batch_op.f('ix_workers_queue'))

    op.drop_table('workers')
