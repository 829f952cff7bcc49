"""initial state schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('goals',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=120), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('spec_hash', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('leases',
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('holder', sa.String(length=200), nullable=True),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('target')
    )
    op.create_table('ledger',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('goal_id', sa.String(length=64), nullable=True),
    sa.Column('run_id', sa.String(length=120), nullable=False),
    sa.Column('idx', sa.Integer(), nullable=False),
    sa.Column('what', sa.String(length=24), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('cards', sa.Integer(), nullable=False),
    sa.Column('card_hours', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'idx', name='uq_ledger_run_idx')
    )
    with op.batch_alter_table('ledger', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ledger_goal_id'), ['goal_id'], unique=False)

    op.create_table('negatives',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('goal_id', sa.String(length=64), nullable=True),
    sa.Column('scenario', sa.String(length=200), nullable=False),
    sa.Column('knob', sa.String(length=80), nullable=False),
    sa.Column('value_key', sa.String(length=200), nullable=False),
    sa.Column('parent_hash', sa.String(length=64), nullable=True),
    sa.Column('source_identity', sa.String(length=200), nullable=True),
    sa.Column('data_version', sa.String(length=200), nullable=True),
    sa.Column('run_id', sa.String(length=120), nullable=True),
    sa.Column('candidate_id', sa.Integer(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('negatives', schema=None) as batch_op:
        batch_op.create_index('ix_negative_lookup', ['scenario', 'knob', 'value_key'], unique=False)
        batch_op.create_index(batch_op.f('ix_negatives_goal_id'), ['goal_id'], unique=False)

    op.create_table('phase_records',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=120), nullable=False),
    sa.Column('phase', sa.String(length=32), nullable=False),
    sa.Column('event', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=True),
    sa.Column('error_class', sa.String(length=80), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('seq')
    )
    with op.batch_alter_table('phase_records', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_phase_records_run_id'), ['run_id'], unique=False)

    op.create_table('results',
    sa.Column('run_id', sa.String(length=120), nullable=False),
    sa.Column('goal_id', sa.String(length=64), nullable=True),
    sa.Column('verdict', sa.String(length=32), nullable=False),
    sa.Column('result', sa.JSON(), nullable=False),
    sa.Column('station_hash', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('run_id')
    )
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_results_goal_id'), ['goal_id'], unique=False)

    op.create_table('runs',
    sa.Column('id', sa.String(length=120), nullable=False),
    sa.Column('goal_id', sa.String(length=64), nullable=True),
    sa.Column('candidate_id', sa.Integer(), nullable=True),
    sa.Column('stage', sa.String(length=16), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('station_hash', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_goal_id'), ['goal_id'], unique=False)

    op.create_table('stations',
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.Column('engine', sa.String(length=32), nullable=False),
    sa.Column('scenario', sa.String(length=200), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('data_version', sa.String(length=200), nullable=False),
    sa.Column('source_identity', sa.String(length=200), nullable=False),
    sa.Column('knobs', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('hash')
    )
    op.create_table('candidates',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('goal_id', sa.String(length=64), nullable=False),
    sa.Column('card', sa.JSON(), nullable=False),
    sa.Column('card_hash', sa.String(length=64), nullable=False),
    sa.Column('knob', sa.String(length=80), nullable=True),
    sa.Column('value', sa.JSON(), nullable=True),
    sa.Column('parent_hash', sa.String(length=64), nullable=True),
    sa.Column('cost_class', sa.String(length=24), nullable=True),
    sa.Column('stage', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['goal_id'], ['goals.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('goal_id', 'card_hash', name='uq_candidate_goal_card')
    )
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_candidates_goal_id'), ['goal_id'], unique=False)

    op.create_table('decisions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('goal_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('candidate_id', sa.Integer(), nullable=True),
    sa.Column('run_id', sa.String(length=120), nullable=True),
    sa.Column('station_hash', sa.String(length=64), nullable=True),
    sa.Column('changed', sa.Boolean(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['goal_id'], ['goals.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_decisions_goal_id'), ['goal_id'], unique=False)

    op.create_table('instructions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('goal_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=24), nullable=False),
    sa.Column('count', sa.Integer(), nullable=True),
    sa.Column('remaining', sa.Integer(), nullable=True),
    sa.Column('knobs', sa.JSON(), nullable=False),
    sa.Column('restore', sa.String(length=64), nullable=True),
    sa.Column('who', sa.String(length=120), nullable=False),
    sa.Column('text', sa.Text(), nullable=True),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['goal_id'], ['goals.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('instructions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_instructions_goal_id'), ['goal_id'], unique=False)

    op.create_table('approvals',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('candidate_id', sa.Integer(), nullable=False),
    sa.Column('card_hash', sa.String(length=64), nullable=False),
    sa.Column('decision', sa.String(length=16), nullable=False),
    sa.Column('who', sa.String(length=120), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['candidate_id'], ['candidates.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('candidate_id', name='uq_approval_candidate')
    )


def downgrade() -> None:
    op.drop_table('approvals')
    with op.batch_alter_table('instructions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_instructions_goal_id'))

    op.drop_table('instructions')
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_decisions_goal_id'))

    op.drop_table('decisions')
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_candidates_goal_id'))

    op.drop_table('candidates')
    op.drop_table('stations')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_goal_id'))

    op.drop_table('runs')
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_results_goal_id'))

    op.drop_table('results')
    with op.batch_alter_table('phase_records', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_phase_records_run_id'))

    op.drop_table('phase_records')
    with op.batch_alter_table('negatives', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_negatives_goal_id'))
        batch_op.drop_index('ix_negative_lookup')

    op.drop_table('negatives')
    with op.batch_alter_table('ledger', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ledger_goal_id'))

    op.drop_table('ledger')
    op.drop_table('leases')
    op.drop_table('goals')
