"""The effect ledger and the transactional outbox.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Kept equal to ledgerloop.effects.messages.EffectStatus and OutboxStatus; tests check they agree.
EFFECT_STATUSES = ("pending", "started", "succeeded", "failed", "outcome_unknown", "needs_human")
OUTBOX_STATUSES = ("pending", "claimed", "done", "dead")
# The statuses a waiting workflow hears about (ledgerloop.effects.messages.REPORTED).
REPORTED = ("succeeded", "failed", "outcome_unknown", "needs_human")


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def upgrade() -> None:
    op.execute(
        f"""
        CREATE TABLE ledgerloop.activity_effect (
          idempotency_key text PRIMARY KEY,
          run_id uuid NOT NULL REFERENCES ledgerloop.agent_run(id) ON DELETE CASCADE,
          tenant_id uuid NOT NULL,
          tool text NOT NULL,
          request_hash text NOT NULL,
          destination text NOT NULL,
          status text NOT NULL DEFAULT 'pending' CHECK (status IN ({_quoted(EFFECT_STATUSES)})),
          external_reference text,
          result jsonb,
          error text,
          -- What the relay and reconciler saw (last error, lookup answers, request): what a
          -- person deciding a needs_human effect reads.
          evidence jsonb,
          -- Every delivery attempt ever made; part of each message id, so never reset.
          attempts int NOT NULL DEFAULT 0,
          lease_until timestamptz,
          compensates text REFERENCES ledgerloop.activity_effect(idempotency_key),
          resolved_by text,
          created_at timestamptz NOT NULL DEFAULT now(),
          updated_at timestamptz NOT NULL DEFAULT now(),
          -- (\\: escapes the colon from SQLAlchemy's bind-parameter syntax)
          CHECK (compensates IS NULL OR idempotency_key = compensates || '\\:compensate')
        )
        """
    )
    # The reconciler's scan: unsettled effects whose lease ran out.
    op.execute(
        "CREATE INDEX activity_effect_unsettled ON ledgerloop.activity_effect "
        "(status, lease_until) WHERE status IN ('started', 'outcome_unknown')"
    )
    op.execute(
        "CREATE INDEX activity_effect_run ON ledgerloop.activity_effect (run_id, created_at)"
    )
    op.execute(
        "CREATE INDEX activity_effect_tenant_status ON ledgerloop.activity_effect "
        "(tenant_id, status, created_at DESC)"
    )
    op.execute(
        f"""
        CREATE TABLE ledgerloop.outbox (
          id bigserial PRIMARY KEY,
          -- One outbox row per effect, enforced here and not only by the ledger's code.
          idempotency_key text NOT NULL UNIQUE
            REFERENCES ledgerloop.activity_effect(idempotency_key) ON DELETE CASCADE,
          tenant_id uuid NOT NULL,
          destination text NOT NULL,
          request jsonb NOT NULL CHECK (jsonb_typeof(request) = 'object'),
          status text NOT NULL DEFAULT 'pending' CHECK (status IN ({_quoted(OUTBOX_STATUSES)})),
          -- Attempts within the current budget; an operator's retry starts a new budget.
          attempts int NOT NULL DEFAULT 0,
          available_at timestamptz NOT NULL DEFAULT now(),
          deadline_at timestamptz NOT NULL,
          lease_until timestamptz,
          last_error text,
          created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # The relay's claim reads only this index; done rows never slow it down.
    op.execute(
        "CREATE INDEX outbox_pending ON ledgerloop.outbox (available_at, id) "
        "WHERE status = 'pending'"
    )

    # Wake the relay. One NOTIFY per INSERT statement, not per row: an effect_begin inserts one
    # row, and a bulk insert of many rows needs only one wake-up, since a woken relay claims
    # everything due. Postgres queues every distinct payload, so per-row notifies would cost a
    # queue entry per row for nothing at 1,000 rows/s in bulk.
    op.execute(
        """
        CREATE FUNCTION ledgerloop.outbox_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
          first_id bigint;
        BEGIN
          SELECT min(id) INTO first_id FROM inserted;
          IF first_id IS NOT NULL THEN
            PERFORM pg_notify('ledgerloop_outbox', first_id::text);
          END IF;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_notify AFTER INSERT ON ledgerloop.outbox "
        "REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT "
        "EXECUTE FUNCTION ledgerloop.outbox_notify()"
    )

    # Tell the waiting workflow. A trigger, so every writer (relay, reconciler, an operator's
    # resolve, a hand-written UPDATE) sends the message in the transaction that records the
    # status, and none can forget. The message id is (key, status, attempts): a repeat is a
    # no-op in dbos.send_message (ON CONFLICT (message_uuid) DO NOTHING). A run without a DBOS
    # workflow (effects written by hand, a workflow already garbage-collected) has nobody to
    # tell; sending would fail the notifications foreign key and wedge the writer, so skip it.
    # SECURITY DEFINER: an operator resolving an effect in a tenant-scoped transaction has no
    # rights on schema dbos, and needs none.
    op.execute(
        """
        CREATE FUNCTION ledgerloop.effect_send_message(e ledgerloop.activity_effect)
        RETURNS boolean
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
          IF NOT EXISTS (
            SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = e.run_id::text
          ) THEN
            RETURN false;
          END IF;
          PERFORM dbos.send_message(
            e.run_id::text,
            json_build_object(
              'key', e.idempotency_key,
              'status', e.status,
              'result', e.result,
              'error', e.error,
              'external_reference', e.external_reference
            ),
            e.idempotency_key,
            e.idempotency_key || ':' || e.status || ':' || e.attempts
          );
          RETURN true;
        END $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION ledgerloop.activity_effect_reported() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
          PERFORM ledgerloop.effect_send_message(NEW);
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER activity_effect_reported
        AFTER UPDATE OF status ON ledgerloop.activity_effect
        FOR EACH ROW
        WHEN (NEW.status IS DISTINCT FROM OLD.status AND NEW.status IN ({_quoted(REPORTED)}))
        EXECUTE FUNCTION ledgerloop.activity_effect_reported()
        """
    )

    # Tenant policies: migration 0024.
    # A tenant must not message workflows with a row it made up; the trigger (which cannot be
    # called directly) runs as the owner, and operators may call this to resend by hand.
    op.execute(
        "REVOKE EXECUTE ON FUNCTION ledgerloop.effect_send_message(ledgerloop.activity_effect) "
        "FROM PUBLIC"
    )
