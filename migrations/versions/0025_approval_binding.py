"""An approval allows one call of one run: the write's record checks run, call and tenant.

The record of a write (effect_record_claimed, migrations 0020 and 0021) let an approval
allow any write whose action hash equalled the approved one. The hash covers the tool, its
arguments, its target and the policy version, not who asks: in a custom orchestration, the
`Approved` that `wait_for_approval` returned for one call let `write_effect` deliver another
call with the same arguments, and another run that named the approval's id delivered too.
One approval paid several times.

The approval row names the run, the tenant and the tool call it was asked for. The check now
holds the write to them, in the same statement (no extra round trip): the approval's run is
the write's run, its tenant the write's tenant, and the write's idempotency key is that of
the approved call (`{run_id}:{tool_call_id}`, the effect protocol's key). The signature is
unchanged. The Python check (agent.effect_record.not_granted) applies the same rules to a
write a relay elsewhere delivers, and names what did not match when this statement answers
`granted` false.

Revision ID: 0025
Revises: 0024
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(_RECORD_CLAIMED_BOUND)


def downgrade() -> None:
    op.execute(_RECORD_CLAIMED_UNBOUND)


# effect_record_claimed as migration 0021 made it, with the approval bound to its call.
_RECORD_CLAIMED_BOUND = """
        CREATE OR REPLACE FUNCTION ledgerloop.effect_record_claimed(
          p_key text, p_run_id uuid, p_tenant_id uuid, p_tool text, p_request_hash text,
          p_destination text, p_request jsonb, p_timeout_ms float8, p_lease_margin_s float8,
          p_deadline_s float8, p_approval_id uuid, p_step text, p_payload jsonb,
          p_allowed_from text[]
        ) RETURNS TABLE (
          current text, granted boolean, there boolean,
          idempotency_key text, run_id uuid, tenant_id uuid, tool text, request_hash text,
          destination text, status text, external_reference text, result jsonb, error text,
          evidence jsonb, attempts integer, lease_until timestamptz, compensates text,
          resolved_by text, created_at timestamptz, updated_at timestamptz,
          outbox_id bigint, deadline_in_s float8
        )
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
        -- The output columns share the tables' column names: a name in a query is a column.
        #variable_conflict use_column
        BEGIN
          -- Nothing is written unless the approval, when there is one, is approved by a
          -- principal for exactly this action, asked by this run (this tenant's) for the
          -- call whose key this is; the effect is written only when the run is
          -- there under this step (moved now, or by an earlier execution of the step). The
          -- answer says what held: no effect columns means the approval, the run or the key
          -- said no.
          RETURN QUERY
          WITH granted AS (
            SELECT 1 WHERE p_approval_id IS NULL
            UNION ALL
            SELECT 1 FROM ledgerloop.approval a
            WHERE a.id = p_approval_id
              AND a.status = 'approved'
              AND a.decided_by_principal IS NOT NULL
              AND a.auth_role IS NOT NULL
              AND a.action_hash = p_request_hash
              -- The approval's own run, tenant and call: the key names the call
              -- (`{run_id}:{tool_call_id}`, effects.hashing.idempotency_key).
              AND a.run_id = p_run_id
              AND a.tenant_id = p_tenant_id
              AND p_key = a.run_id::text || ':' || a.tool_call_id
          ), cur AS (
            SELECT r.id, r.status FROM ledgerloop.agent_run r WHERE r.id = p_run_id
            FOR NO KEY UPDATE
          ), seen AS (
            SELECT 1 FROM ledgerloop.agent_run_event e
            WHERE e.run_id = p_run_id AND e.step = p_step
          ), moved AS (
            UPDATE ledgerloop.agent_run r
            SET status = 'executing', version = r.version + 1, updated_at = now()
            FROM cur
            WHERE r.id = cur.id
              AND cur.status = ANY(p_allowed_from)
              AND EXISTS (SELECT 1 FROM granted)
              AND NOT EXISTS (SELECT 1 FROM seen)
            RETURNING r.id, r.tenant_id, r.version
          ), event AS (
            INSERT INTO ledgerloop.agent_run_event
              (run_id, tenant_id, sequence, event_type, payload, step)
            SELECT m.id, m.tenant_id, m.version, 'executing', p_payload, p_step FROM moved m
          ), effect AS (
            INSERT INTO ledgerloop.activity_effect
              (idempotency_key, run_id, tenant_id, tool, request_hash, destination, status,
               attempts, lease_until, awaited)
            SELECT p_key, p_run_id, p_tenant_id, p_tool, p_request_hash, p_destination,
                   'started', 1,
                   now() + make_interval(secs => p_timeout_ms / 1000 + p_lease_margin_s),
                   false
            WHERE EXISTS (SELECT 1 FROM granted)
              AND (EXISTS (SELECT 1 FROM moved) OR EXISTS (SELECT 1 FROM seen))
            ON CONFLICT (idempotency_key) DO NOTHING
            RETURNING *
          ), queued AS (
            INSERT INTO ledgerloop.outbox
              (idempotency_key, tenant_id, destination, request, deadline_at, status,
               attempts, lease_until)
            SELECT f.idempotency_key, f.tenant_id, f.destination, p_request,
                   now() + make_interval(secs => p_deadline_s), 'claimed', 1, f.lease_until
            FROM effect f
            RETURNING id, extract(epoch FROM deadline_at - now())::float8 AS deadline_in_s
          )
          SELECT cur.status,
                 EXISTS (SELECT 1 FROM granted),
                 EXISTS (SELECT 1 FROM moved) OR EXISTS (SELECT 1 FROM seen),
                 f.idempotency_key, f.run_id, f.tenant_id, f.tool, f.request_hash,
                 f.destination, f.status, f.external_reference, f.result, f.error,
                 f.evidence, f.attempts, f.lease_until, f.compensates, f.resolved_by,
                 f.created_at, f.updated_at, q.id, q.deadline_in_s
          FROM cur
          LEFT JOIN (effect f CROSS JOIN queued q) ON true;
        END $$
"""

# As migration 0021 made it: any write of the approved action's hash.
_RECORD_CLAIMED_UNBOUND = _RECORD_CLAIMED_BOUND.replace(
    """
              -- The approval's own run, tenant and call: the key names the call
              -- (`{run_id}:{tool_call_id}`, effects.hashing.idempotency_key).
              AND a.run_id = p_run_id
              AND a.tenant_id = p_tenant_id
              AND p_key = a.run_id::text || ':' || a.tool_call_id
""",
    "\n",
).replace(
    """principal for exactly this action, asked by this run (this tenant's) for the
          -- call whose key this is; the effect is written only when the run is""",
    """principal for exactly this action; the effect is written only when the run is""",
)
