"""Coverage: the data regime of each config as a column, the numeric facts of each run

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('data_regime', sa.String(length=16), server_default='normal', nullable=False))
        batch_op.add_column(sa.Column('facts', sa.JSON(), nullable=True))
        batch_op.create_index('ix_config_runs_data_regime', ['data_regime'], unique=False)
    # The config JSON names a regime other than the default (AttentionConfig.to_dict); rows
    # without one keep the server default, `normal`.
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("UPDATE config_runs SET data_regime = config->>'data_regime' "
                   "WHERE config->>'data_regime' IS NOT NULL")
    else:
        op.execute("UPDATE config_runs SET data_regime = json_extract(config, '$.data_regime') "
                   "WHERE json_extract(config, '$.data_regime') IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_config_runs_data_regime')
        batch_op.drop_column('facts')
        batch_op.drop_column('data_regime')
