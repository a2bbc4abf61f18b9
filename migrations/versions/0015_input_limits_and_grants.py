"""Run inputs: one depth and size limit in start_run.

(This revision also made the first grant for application roles; migration 0024 replaced it
with one that grants start_run alone, and a fresh install now gets only that one.)

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# The limits below (262144 bytes, 64 levels) equal ledgerloop.runs.start.MAX_INPUT_BYTES and
# MAX_INPUT_DEPTH; tests/integration/test_input_limits.py checks that HTTP and SQL refuse at
# the same place.


def upgrade() -> None:
    _input_depth()
    _start_run()


def _input_depth() -> None:
    # Level by level rather than recursively: a hostile document costs one pass per level and
    # stops as soon as it passes the limit, and nothing recurses on the server's stack.
    op.execute(
        """
        CREATE FUNCTION ledgerloop.jsonb_depth_exceeds(doc jsonb, max_depth int)
        RETURNS boolean
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
          v_level jsonb[] := ARRAY[doc];
          v_depth int := 0;
        BEGIN
          WHILE cardinality(v_level) > 0 LOOP
            SELECT coalesce(array_agg(child.value), '{}')
            INTO v_level
            FROM unnest(v_level) AS parent(value)
            CROSS JOIN LATERAL (
              SELECT e.value FROM jsonb_each(
                CASE WHEN jsonb_typeof(parent.value) = 'object' THEN parent.value END) AS e
              UNION ALL
              SELECT a.value FROM jsonb_array_elements(
                CASE WHEN jsonb_typeof(parent.value) = 'array' THEN parent.value END) AS a
            ) AS child
            WHERE jsonb_typeof(child.value) IN ('object', 'array');
            v_depth := v_depth + 1;
            IF v_depth + (cardinality(v_level) > 0)::int > max_depth THEN
              RETURN true;
            END IF;
          END LOOP;
          RETURN false;
        END $$
        """
    )


def _start_run() -> None:
    # As 0004's, with two changes: the input's nesting is limited like its size (the same
    # limits as POST /v1/runs, so no path stores what another cannot read back), and a caller
    # without a tenant scope (an application role, see grant_start_run) is scoped to the run's
    # tenant for the function's own statements, so row-level security admits them.
    op.execute(
        r"""
        CREATE OR REPLACE FUNCTION ledgerloop.start_run(
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
              MESSAGE = format('ledgerloop.start_run: input is %s bytes, over the '
                               '262144-byte (256 KiB) limit', v_size),
              HINT = 'store large documents in a table and pass their id in the input';
          END IF;
          IF ledgerloop.jsonb_depth_exceeds(start_run.input, 64) THEN
            RAISE EXCEPTION USING
              ERRCODE = 'LL001',
              MESSAGE = 'ledgerloop.start_run: input is nested more than 64 '
                        'levels deep, over the 64-level limit',
              HINT = 'flatten the input, or store the document in a table and pass its id';
          END IF;
          IF start_run.idempotency_key IS NOT NULL
             AND (start_run.idempotency_key = '' OR length(start_run.idempotency_key) > 255) THEN
            RAISE EXCEPTION USING
              ERRCODE = 'LL001',
              MESSAGE = format('ledgerloop.start_run: idempotency_key must be 1-255 '
                               'characters, not %s', length(start_run.idempotency_key)),
              HINT = 'pass NULL for no key, or a stable id such as ''order:'' || id';
          END IF;
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
          IF v_scope_tenant IS NULL THEN
            -- Transaction-local, and cleared again before returning.
            PERFORM set_config('ledgerloop.tenant_id', v_tenant::text, true);
          END IF;

          INSERT INTO ledgerloop.agent_run (id, tenant_id, agent, status, state, input,
                                            idempotency_key)
          VALUES (gen_random_uuid(), v_tenant, start_run.agent, 'received', '{}'::jsonb,
                  start_run.input, start_run.idempotency_key)
          ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL
          DO NOTHING
          RETURNING id INTO v_run_id;

          IF v_run_id IS NULL THEN
            SELECT r.id INTO v_run_id
            FROM ledgerloop.agent_run r
            WHERE r.tenant_id = v_tenant AND r.idempotency_key = start_run.idempotency_key;
          ELSE
            INSERT INTO ledgerloop.agent_run_event (run_id, tenant_id, sequence, event_type,
                                                    payload)
            VALUES (v_run_id, v_tenant, 0, 'received',
                    jsonb_build_object('agent', start_run.agent));

            PERFORM dbos.enqueue_workflow(
              workflow_name => 'ledgerloop_run',
              queue_name => 'ledgerloop_runs',
              positional_args => ARRAY[to_json(v_run_id::text)],
              workflow_id => v_run_id::text,
              app_version => nullif(current_setting('ledgerloop.application_version', true), '')
            );
            PERFORM pg_notify('ledgerloop_runs', v_run_id::text);
          END IF;
          IF v_scope_tenant IS NULL THEN
            PERFORM set_config('ledgerloop.tenant_id', '', true);
          END IF;
          RETURN v_run_id;
        END;
        $fn$
        """
    )
