"""Approvals, principals (approver and API tokens) and the SQL entry point start_run.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Kept equal to ledgerloop.approvals.store.ApprovalStatus; tests/integration/test_approval_store.py
# checks they agree.
APPROVAL_STATUSES = ("pending", "approved", "rejected", "expired", "superseded", "cancelled")


def upgrade() -> None:
    _principal()
    _approval()
    _start_run()


def _principal() -> None:
    # Authentication happens before any tenant scope exists, so principals are read by the
    # owner role without row-level security. No other role gets a grant: only Ledgerloop's
    # own processes may read token hashes, or even list names.
    op.execute(
        """
        CREATE TABLE ledgerloop.principal (
          id uuid PRIMARY KEY,
          tenant_id uuid NOT NULL,
          name text NOT NULL CHECK (name <> ''),
          roles text[] NOT NULL CHECK (cardinality(roles) > 0),
          token_hash text NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now(),
          revoked_at timestamptz
        )
        """
    )
    op.execute("CREATE INDEX principal_tenant ON ledgerloop.principal (tenant_id, created_at)")
    op.execute("REVOKE ALL ON ledgerloop.principal FROM PUBLIC")


def _approval() -> None:
    statuses = ", ".join(f"'{s}'" for s in APPROVAL_STATUSES)
    op.execute(
        f"""
        CREATE TABLE ledgerloop.approval (
          id uuid PRIMARY KEY,
          run_id uuid NOT NULL REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE,
          tenant_id uuid NOT NULL,
          tool text NOT NULL,
          tool_call_id text NOT NULL,
          action_hash text NOT NULL,
          preview jsonb NOT NULL DEFAULT '{{}}'::jsonb,
          policy_version text NOT NULL,
          required_roles text[] NOT NULL CHECK (cardinality(required_roles) > 0),
          requested_at timestamptz NOT NULL DEFAULT now(),
          expires_at timestamptz,
          status text NOT NULL DEFAULT 'pending' CHECK (status IN ({statuses})),
          decided_by_principal uuid REFERENCES ledgerloop.principal(id),
          decided_by_name text,
          auth_token_id uuid,
          auth_role text,
          decision text CHECK (decision IN ('approved', 'rejected')),
          reason text,
          decided_at timestamptz,
          closed_at timestamptz,
          UNIQUE (run_id, tool_call_id, action_hash),
          -- A decision and the status it produced are one fact: a row cannot claim to be
          -- approved without saying who approved it and when, nor carry a stray decision.
          CONSTRAINT approval_decision_matches_status CHECK (
            (status IN ('approved', 'rejected')
              AND decision = status
              AND decided_by_principal IS NOT NULL
              AND auth_role IS NOT NULL
              AND decided_at IS NOT NULL)
            OR (status NOT IN ('approved', 'rejected') AND decision IS NULL)
          ),
          CONSTRAINT approval_closed_unless_pending
            CHECK ((status = 'pending') = (closed_at IS NULL))
        )
        """
    )
    op.execute(
        "CREATE INDEX approval_pending ON ledgerloop.approval (tenant_id, requested_at DESC) "
        "WHERE status = 'pending'"
    )
    op.execute(
        "CREATE INDEX approval_pending_expiry ON ledgerloop.approval (expires_at) "
        "WHERE status = 'pending' AND expires_at IS NOT NULL"
    )
    op.execute(
        "CREATE INDEX approval_tenant_requested ON ledgerloop.approval "
        "(tenant_id, requested_at DESC)"
    )
    # Tenant policy: migration 0024. Decisions go through approval_decide, which checks the
    # principal, the role and the run before it writes.


def _start_run() -> None:
    # docs/sql_start_run.md is the user-facing description of this function.
    # SECURITY INVOKER: the caller's own privileges and row-level security apply, so the
    # function grants nothing its caller could not already do with INSERTs.
    # `#variable_conflict use_column`: the parameter names (agent, input, tenant_id,
    # idempotency_key) are also column names; inside SQL statements they mean the column, and
    # the parameters are always written start_run.<name>.
    op.execute(
        r"""
        CREATE FUNCTION ledgerloop.start_run(
          agent text,
          input jsonb,
          idempotency_key text DEFAULT NULL,
          tenant_id uuid DEFAULT NULL
        ) RETURNS uuid
        LANGUAGE plpgsql
        VOLATILE
        SECURITY INVOKER
        SET search_path = pg_catalog, pg_temp
        AS $fn$
        #variable_conflict use_column
        DECLARE
          v_scope_tenant uuid := ledgerloop.current_tenant();
          v_tenant uuid;
          v_run_id uuid;
          v_size bigint;
        BEGIN
          IF start_run.agent IS NULL OR start_run.agent !~ '^[a-z][a-z0-9_-]{0,63}$' THEN
            RAISE EXCEPTION USING
              ERRCODE = 'LL001',
              MESSAGE = format('ledgerloop.start_run: agent %s is not a valid agent name',
                               coalesce(quote_literal(start_run.agent), 'NULL')),
              HINT = 'pass the name the agent is registered under: 1-64 characters, a '
                     'lowercase letter first, then lowercase letters, digits, _ or -';
          END IF;
          IF start_run.input IS NULL OR jsonb_typeof(start_run.input) <> 'object' THEN
            RAISE EXCEPTION USING
              ERRCODE = 'LL001',
              MESSAGE = format('ledgerloop.start_run: input must be a JSON object, not %s',
                               coalesce(jsonb_typeof(start_run.input), 'NULL')),
              HINT = 'wrap the value in an object, e.g. jsonb_build_object(''message'', ...)';
          END IF;
          v_size := octet_length(start_run.input::text);
          IF v_size > 262144 THEN
            RAISE EXCEPTION USING
              ERRCODE = 'LL001',
              MESSAGE = format('ledgerloop.start_run: input is %s bytes, over the 262144-byte '
                               '(256 KiB) limit', v_size),
              HINT = 'store large documents in a table and pass their id in the input';
          END IF;
          IF start_run.idempotency_key IS NOT NULL
             AND (start_run.idempotency_key = '' OR length(start_run.idempotency_key) > 255) THEN
            RAISE EXCEPTION USING
              ERRCODE = 'LL001',
              MESSAGE = format('ledgerloop.start_run: idempotency_key must be 1-255 '
                               'characters, not %s', length(start_run.idempotency_key)),
              HINT = 'pass NULL for no key, or a stable id such as ''order:'' || id';
          END IF;
          -- Inside a tenant scope the run belongs to that tenant; naming another one is a
          -- mistake worth an error rather than a run the caller cannot see.
          IF v_scope_tenant IS NOT NULL AND start_run.tenant_id IS NOT NULL
             AND start_run.tenant_id <> v_scope_tenant THEN
            RAISE EXCEPTION USING
              ERRCODE = 'LL001',
              MESSAGE = format('ledgerloop.start_run: tenant_id %s differs from this '
                               'transaction''s tenant %s', start_run.tenant_id, v_scope_tenant),
              HINT = 'omit tenant_id inside a tenant scope, or pass the scope''s tenant';
          END IF;
          v_tenant := coalesce(start_run.tenant_id, v_scope_tenant,
                               '00000000-0000-0000-0000-000000000000'::uuid);

          -- The same INSERTs as app/ledgerloop/runs/queries.sql run_insert and run_event_insert.
          INSERT INTO ledgerloop.agent_run (id, tenant_id, agent, status, state, input,
                                            idempotency_key)
          VALUES (gen_random_uuid(), v_tenant, start_run.agent, 'received', '{}'::jsonb,
                  start_run.input, start_run.idempotency_key)
          ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL
          DO NOTHING
          RETURNING id INTO v_run_id;

          IF v_run_id IS NULL THEN
            -- The key was used before: that run (and its one workflow) is the answer. Do not
            -- enqueue again: DBOS would re-create a workflow row that retention had deleted.
            SELECT r.id INTO v_run_id
            FROM ledgerloop.agent_run r
            WHERE r.tenant_id = v_tenant AND r.idempotency_key = start_run.idempotency_key;
            RETURN v_run_id;
          END IF;

          INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type,
                                                  payload)
          VALUES (v_run_id, v_tenant, 0, 'received',
                  jsonb_build_object('agent', start_run.agent));

          -- DBOS's own SQL entry point, in this same transaction: a rollback leaves neither
          -- the run nor the workflow. The input is the portable-JSON run id; a NULL version
          -- lets whichever executor runs the latest application version take the run, unless
          -- the database or session pins one with ledgerloop.application_version.
          PERFORM dbos.enqueue_workflow(
            workflow_name => 'ledgerloop_run',
            queue_name => 'ledgerloop_runs',
            positional_args => ARRAY[to_json(v_run_id::text)],
            workflow_id => v_run_id::text,
            app_version => nullif(current_setting('ledgerloop.application_version', true), '')
          );
          -- Delivered on commit only; lets a worker dequeue now instead of at its next poll.
          PERFORM pg_notify('ledgerloop_runs', v_run_id::text);
          RETURN v_run_id;
        END;
        $fn$
        """
    )
