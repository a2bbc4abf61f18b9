"""Runs whose recent past a failover lost: their writes are found again by key, never resent
blindly.

After a failover to a replica that lagged, the database may no longer hold the record of a
write the old primary's relay had already delivered. The run resumes from the journal the
new primary holds and records the write again, under the same key (`{run_id}:{call}`): sent
as a new write, a destination that neither honours the key nor can be asked about it would
get it twice, and one that can be asked would never be asked.

A worker that finds the database went back in time (fleet/heartbeat.py, the rewind check)
names those runs in `run_rewound`. An effect (and its outbox row) recorded for such a run is
born as an attempt whose outcome is unknown: `started`, one attempt made, its lease already
run out, its evidence saying why. The reconciler takes it at once and decides by what the
destination offers (a lookup, a resend with the key, a person), as it does for a relay that
died mid-call; the worker that recorded it does not send it (agent/effect_record.py,
agent/write_ahead.py), its step waits for the ledger's message instead.

Each worker also publishes, every few seconds, the workflows it executes (`executor.executing`,
as of `executing_at`), so `ledgerloop runs stuck` can list a run whose workflow is PENDING
under a live worker that no longer executes it (its end was lost, say).

Revision ID: 0027
Revises: 0026
"""

from alembic import op

revision = "0027"
# The failover branch was built on 0025; 0026 comes from another branch (fixed at merge).
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE ledgerloop.executor
          ADD COLUMN executing text[],
          ADD COLUMN executing_at timestamptz;

        CREATE TABLE ledgerloop.run_rewound (
          run_id uuid PRIMARY KEY,
          noticed_at timestamptz NOT NULL DEFAULT now(),
          timeline int
        );

        -- SECURITY DEFINER: a write recorded in a tenant's scope reads this table too.
        CREATE FUNCTION ledgerloop.effect_born_rewound() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, ledgerloop AS $$
        BEGIN
          IF NEW.status IN ('pending', 'started') AND EXISTS (
               SELECT 1 FROM ledgerloop.run_rewound r WHERE r.run_id = NEW.run_id) THEN
            NEW.status := 'started';
            NEW.attempts := greatest(NEW.attempts, 1);
            NEW.lease_until := now();
            NEW.evidence := coalesce(NEW.evidence, '{}'::jsonb) || jsonb_build_object(
              'rewound', 'a failover lost this run''s recent past: this write may have '
                         'been delivered already, so it is found again by its key');
          END IF;
          RETURN NEW;
        END $$;

        CREATE TRIGGER activity_effect_born_rewound
          BEFORE INSERT ON ledgerloop.activity_effect
          FOR EACH ROW EXECUTE FUNCTION ledgerloop.effect_born_rewound();

        -- The outbox row of the same write: claimed by no one, its lease run out, so no relay
        -- claims it (the reconciler requeues it when a send is safe). Its run is the key's
        -- first part (the effect row of the same statement is not visible here).
        CREATE FUNCTION ledgerloop.outbox_born_rewound() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, ledgerloop AS $$
        BEGIN
          IF NEW.status IN ('pending', 'claimed') AND EXISTS (
               SELECT 1 FROM ledgerloop.run_rewound r
               WHERE r.run_id::text = left(NEW.idempotency_key, 36)) THEN
            NEW.status := 'claimed';
            NEW.attempts := greatest(NEW.attempts, 1);
            NEW.lease_until := now();
          END IF;
          RETURN NEW;
        END $$;

        CREATE TRIGGER outbox_born_rewound
          BEFORE INSERT ON ledgerloop.outbox
          FOR EACH ROW EXECUTE FUNCTION ledgerloop.outbox_born_rewound();
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER outbox_born_rewound ON ledgerloop.outbox;
        DROP TRIGGER activity_effect_born_rewound ON ledgerloop.activity_effect;
        DROP FUNCTION ledgerloop.outbox_born_rewound();
        DROP FUNCTION ledgerloop.effect_born_rewound();
        DROP TABLE ledgerloop.run_rewound;
        ALTER TABLE ledgerloop.executor DROP COLUMN executing, DROP COLUMN executing_at;
        """
    )
