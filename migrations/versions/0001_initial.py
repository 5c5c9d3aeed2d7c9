"""initial schema: sweeps, filter counts, config runs

Revision ID: 0001
Revises: 
Create Date: 2026-12-03
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('sweeps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('label', sa.String(length=200), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('seed', sa.BigInteger(), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('draws', sa.BigInteger(), nullable=False),
    sa.Column('configs_total', sa.Integer(), nullable=False),
    sa.Column('splitkv_budget', sa.BigInteger(), nullable=False),
    sa.Column('budget_source', sa.String(length=16), nullable=False),
    sa.Column('device', sa.String(length=200), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sweeps_label'), ['label'], unique=False)
        batch_op.create_index(batch_op.f('ix_sweeps_status'), ['status'], unique=False)

    op.create_table('config_runs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('sweep_id', sa.Integer(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('dtype', sa.String(length=8), nullable=False),
    sa.Column('g', sa.Integer(), nullable=False),
    sa.Column('seq_len_q', sa.Integer(), nullable=False),
    sa.Column('seq_len_k', sa.Integer(), nullable=False),
    sa.Column('num_heads_q', sa.Integer(), nullable=False),
    sa.Column('num_heads_kv', sa.Integer(), nullable=False),
    sa.Column('gqa_ratio', sa.Integer(), nullable=False),
    sa.Column('head_dim_qk', sa.Integer(), nullable=False),
    sa.Column('head_dim_v', sa.Integer(), nullable=False),
    sa.Column('with_attn_scale', sa.Boolean(), nullable=False),
    sa.Column('with_attn_bias', sa.Boolean(), nullable=False),
    sa.Column('causal', sa.Boolean(), nullable=False),
    sa.Column('has_prefix_offset', sa.Boolean(), nullable=False),
    sa.Column('kv_cache', sa.Boolean(), nullable=False),
    sa.Column('trans_q', sa.Boolean(), nullable=False),
    sa.Column('trans_k', sa.Boolean(), nullable=False),
    sa.Column('trans_v', sa.Boolean(), nullable=False),
    sa.Column('trans_o', sa.Boolean(), nullable=False),
    sa.Column('return_lse', sa.Boolean(), nullable=False),
    sa.Column('split_kv', sa.Integer(), nullable=False),
    sa.Column('data_seed', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=True),
    sa.Column('failed_gate', sa.String(length=16), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('not_applicable_reason', sa.String(length=64), nullable=True),
    sa.Column('rms_threshold', sa.Float(), nullable=True),
    sa.Column('threshold_reason', sa.String(length=32), nullable=True),
    sa.Column('gates', sa.JSON(), nullable=True),
    sa.Column('backend', sa.String(length=16), nullable=True),
    sa.Column('device', sa.String(length=200), nullable=True),
    sa.Column('driver_version', sa.String(length=64), nullable=True),
    sa.Column('compiler_version', sa.String(length=64), nullable=True),
    sa.Column('variant', sa.String(length=200), nullable=True),
    sa.Column('block_n', sa.Integer(), nullable=True),
    sa.Column('source_hash', sa.String(length=64), nullable=True),
    sa.Column('compile_s', sa.Float(), nullable=True),
    sa.Column('inputs_s', sa.Float(), nullable=True),
    sa.Column('run_s', sa.Float(), nullable=True),
    sa.Column('reference_s', sa.Float(), nullable=True),
    sa.Column('verify_s', sa.Float(), nullable=True),
    sa.Column('total_s', sa.Float(), nullable=True),
    sa.Column('out_rms', sa.Float(), nullable=True),
    sa.Column('out_row_err', sa.Float(), nullable=True),
    sa.Column('out_max_abs', sa.Float(), nullable=True),
    sa.Column('out_max_rel', sa.Float(), nullable=True),
    sa.Column('out_err_ratio', sa.Float(), nullable=True),
    sa.Column('lse_rms', sa.Float(), nullable=True),
    sa.Column('lse_max_abs', sa.Float(), nullable=True),
    sa.Column('lse_row_err', sa.Float(), nullable=True),
    sa.Column('partials_row_err', sa.Float(), nullable=True),
    sa.Column('partials_lse_max_abs', sa.Float(), nullable=True),
    sa.Column('out_nonfinite', sa.BigInteger(), nullable=True),
    sa.Column('lse_inf_mismatch', sa.BigInteger(), nullable=True),
    sa.Column('lse_nonfinite', sa.BigInteger(), nullable=True),
    sa.Column('partials_invalid_bad', sa.BigInteger(), nullable=True),
    sa.Column('partials_nonfinite', sa.BigInteger(), nullable=True),
    sa.Column('reproducer', sa.Text(), nullable=True),
    sa.Column('worker', sa.String(length=200), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('sweep_id', 'config_hash', name='uq_config_runs_sweep_config')
    )
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_config_runs_causal'), ['causal'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_config_hash'), ['config_hash'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_dtype'), ['dtype'], unique=False)
        batch_op.create_index('ix_config_runs_dtype_split', ['dtype', 'split_kv'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_failed_gate'), ['failed_gate'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_gqa_ratio'), ['gqa_ratio'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_head_dim_qk'), ['head_dim_qk'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_kv_cache'), ['kv_cache'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_outcome'), ['outcome'], unique=False)
        batch_op.create_index('ix_config_runs_outcome_finished', ['outcome', 'finished_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_seq_len_k'), ['seq_len_k'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_seq_len_q'), ['seq_len_q'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_source_hash'), ['source_hash'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_split_kv'), ['split_kv'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_state'), ['state'], unique=False)
        batch_op.create_index(batch_op.f('ix_config_runs_sweep_id'), ['sweep_id'], unique=False)
        batch_op.create_index('ix_config_runs_sweep_outcome', ['sweep_id', 'outcome'], unique=False)

    op.create_table('filter_counts',
    sa.Column('sweep_id', sa.Integer(), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('count', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('sweep_id', 'reason')
    )


def downgrade() -> None:
    op.drop_table('filter_counts')
    with op.batch_alter_table('config_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_config_runs_sweep_outcome')
        batch_op.drop_index(batch_op.f('ix_config_runs_sweep_id'))
        batch_op.drop_index(batch_op.f('ix_config_runs_state'))
        batch_op.drop_index(batch_op.f('ix_config_runs_split_kv'))
        batch_op.drop_index(batch_op.f('ix_config_runs_source_hash'))
        batch_op.drop_index(batch_op.f('ix_config_runs_seq_len_q'))
        batch_op.drop_index(batch_op.f('ix_config_runs_seq_len_k'))
        batch_op.drop_index('ix_config_runs_outcome_finished')
        batch_op.drop_index(batch_op.f('ix_config_runs_outcome'))
        batch_op.drop_index(batch_op.f('ix_config_runs_kv_cache'))
        batch_op.drop_index(batch_op.f('ix_config_runs_head_dim_qk'))
        batch_op.drop_index(batch_op.f('ix_config_runs_gqa_ratio'))
        batch_op.drop_index(batch_op.f('ix_config_runs_failed_gate'))
        batch_op.drop_index('ix_config_runs_dtype_split')
        batch_op.drop_index(batch_op.f('ix_config_runs_dtype'))
        batch_op.drop_index(batch_op.f('ix_config_runs_config_hash'))
        batch_op.drop_index(batch_op.f('ix_config_runs_causal'))

    op.drop_table('config_runs')
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sweeps_status'))
        batch_op.drop_index(batch_op.f('ix_sweeps_label'))

    op.drop_table('sweeps')
