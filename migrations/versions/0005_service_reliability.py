"""Service reliability: the outbox of config_runs, idempotency keys, webhook body hashes

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('enqueues', sa.Integer(), server_default='0', nullable=False))
    # Configs stored before the outbox were published when their sweep was submitted.
    op.execute("UPDATE config_runs SET enqueued_at = CURRENT_TIMESTAMP, enqueues = 1")

    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idempotency_key', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('request_sha256', sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint('uq_sweeps_idempotency_key', ['idempotency_key'])

    with op.batch_alter_table('ci_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('body_sha256', sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint('uq_ci_deliveries_body_sha256', ['body_sha256'])


def downgrade() -> None:
    with op.batch_alter_table('ci_deliveries', schema=None) as batch_op:
        batch_op.drop_constraint('uq_ci_deliveries_body_sha256', type_='unique')
        batch_op.drop_column('body_sha256')

    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_constraint('uq_sweeps_idempotency_key', type_='unique')
        batch_op.drop_column('request_sha256')
        batch_op.drop_column('idempotency_key')

    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.drop_column('enqueues')
        batch_op.drop_column('enqueued_at')
