-- Ledgerloop's objects on DBOS's tables (ledgerloop/db/dbos_objects.py checks and installs them).
-- DBOS owns schema dbos and migrates it on its own schedule: a migration that rebuilds a table
-- drops what is attached to it without a word. `ledgerloop db upgrade` re-creates every object
-- here that is missing or differs; the start-up check refuses to run without them.

-- name: wake_function_create
-- Wake hibernated runs: a message to a run parked out of memory puts it back on the queue, in
-- the sender's transaction, so every sender (a decision, an effect's outcome, an operator's
-- resolve, DBOS.send itself) wakes it. It locks the workflow row before looking at it, as the
-- park does (agent/hibernation.sql): either the park sees this message and re-enqueues, or this
-- sees the parked row and wakes it. Only Ledgerloop's runs: other DELAYED workflows (a user's
-- delayed or debounced ones) keep their delay. SECURITY DEFINER: senders need no rights on
-- dbos.workflow_status.
--
-- It fires on every message in the database, the user's own included, so it must never break
-- a send that is not to a Ledgerloop run (a DBOS upgrade that renamed a column, say): any error
-- is caught. For a message to one of Ledgerloop's runs (known by its own agent_run table, not
-- by DBOS's columns, which may be what broke) the error is raised again, so the sender's
-- transaction fails and is retried, rather than the run sleeping until its deadline; for any
-- other message it is logged as a WARNING and the statement goes through.
CREATE OR REPLACE FUNCTION ledgerloop.wake_hibernated_run() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_status text;
  v_state text;
  v_error text;
BEGIN
  BEGIN
    SELECT status INTO v_status
    FROM dbos.workflow_status
    WHERE workflow_uuid = NEW.destination_uuid AND name = 'ledgerloop_run'
    FOR UPDATE;
    IF v_status = 'DELAYED' THEN
      UPDATE dbos.workflow_status
      SET status = 'ENQUEUED',
          delay_until_epoch_ms = NULL,
          updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
      WHERE workflow_uuid = NEW.destination_uuid AND status = 'DELAYED';
    END IF;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_error = MESSAGE_TEXT;
    IF NEW.destination_uuid ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
       AND EXISTS (
         SELECT 1 FROM ledgerloop.agent_run WHERE id = NEW.destination_uuid::uuid
       ) THEN
      RAISE EXCEPTION 'ledgerloop could not wake run % for its message: % (SQLSTATE %)',
        NEW.destination_uuid, v_error, v_state
        USING HINT = 'run `ledgerloop db upgrade`; if it persists, DBOS changed a table '
                     'Ledgerloop relies on (see docs/operations.md, Upgrading DBOS)';
    END IF;
    RAISE WARNING 'ledgerloop_wake_hibernated skipped a message to workflow %: % (SQLSTATE %)',
      NEW.destination_uuid, v_error, v_state
      USING HINT = 'the message was stored; run `ledgerloop db upgrade` to repair the trigger';
  END;
  RETURN NULL;
END $$

-- name: wake_function_revoke
REVOKE EXECUTE ON FUNCTION ledgerloop.wake_hibernated_run() FROM PUBLIC

-- name: wake_trigger_drop
DROP TRIGGER IF EXISTS ledgerloop_wake_hibernated ON dbos.notifications

-- name: wake_trigger_create
CREATE TRIGGER ledgerloop_wake_hibernated AFTER INSERT ON dbos.notifications
FOR EACH ROW EXECUTE FUNCTION ledgerloop.wake_hibernated_run()

-- name: function_state
-- An installed function of ours: its source and whether it is SECURITY DEFINER.
SELECT p.prosrc AS source, p.prosecdef AS definer
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'ledgerloop' AND p.proname = %(name)s AND p.pronargs = 0

-- name: trigger_state
-- An installed trigger of ours on a DBOS table: its definition as Postgres prints it, and
-- whether it fires (tgenabled O: origin, A: always; D: disabled, R: replica only).
SELECT to_regclass(%(table)s) IS NOT NULL AS table_exists,
       (SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
        WHERE t.tgrelid = to_regclass(%(table)s) AND t.tgname = %(name)s) AS definition,
       (SELECT t.tgenabled::text FROM pg_trigger t
        WHERE t.tgrelid = to_regclass(%(table)s) AND t.tgname = %(name)s) AS enabled

-- name: notify_function_create
-- Wake the workers' dispatchers: a run became ENQUEUED on Ledgerloop's queue (started from SQL
-- or HTTP, woken from hibernation, handed back by a takeover or a clean stop, promoted from
-- DELAYED). The payload is constant, so Postgres folds a burst in one transaction into one
-- notification. A notification that cannot be queued (Postgres's notify queue full, say) must
-- not fail the statement that enqueued the run: the dispatchers' slow poll finds the run
-- anyway, so the error is logged as a WARNING and the statement goes through.
CREATE OR REPLACE FUNCTION ledgerloop.notify_run_enqueued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_state text;
  v_error text;
BEGIN
  BEGIN
    PERFORM pg_notify('ledgerloop_runs', '');
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_error = MESSAGE_TEXT;
    RAISE WARNING 'ledgerloop_run_enqueued could not notify the dispatchers: % (SQLSTATE %)',
      v_error, v_state
      USING HINT = 'the run is queued; workers find it at their next poll '
                   '(LEDGERLOOP_DISPATCH_FALLBACK_S)';
  END;
  RETURN NULL;
END $$

-- name: notify_function_revoke
REVOKE EXECUTE ON FUNCTION ledgerloop.notify_run_enqueued() FROM PUBLIC

-- name: notify_insert_trigger_drop
DROP TRIGGER IF EXISTS ledgerloop_run_enqueued_insert ON dbos.workflow_status

-- name: notify_insert_trigger_create
-- The WHEN clause keeps the cost off every other write to DBOS's table.
CREATE TRIGGER ledgerloop_run_enqueued_insert AFTER INSERT ON dbos.workflow_status
FOR EACH ROW WHEN (NEW.status = 'ENQUEUED' AND NEW.queue_name = 'ledgerloop_runs')
EXECUTE FUNCTION ledgerloop.notify_run_enqueued()

-- name: notify_update_trigger_drop
DROP TRIGGER IF EXISTS ledgerloop_run_enqueued_update ON dbos.workflow_status

-- name: notify_update_trigger_create
CREATE TRIGGER ledgerloop_run_enqueued_update AFTER UPDATE OF status ON dbos.workflow_status
FOR EACH ROW WHEN (NEW.status = 'ENQUEUED' AND NEW.queue_name = 'ledgerloop_runs')
EXECUTE FUNCTION ledgerloop.notify_run_enqueued()

-- name: public_functions
-- Functions of either schema that every role may execute (PUBLIC's EXECUTE, which Postgres
-- grants on every new function): DBOS's migrations and ours create them that way. With USAGE
-- on schema ledgerloop an application role could then call any of them; only the roles
-- granted a function (`ledgerloop db grant`: start_run, run_traceparent) may.
SELECT n.nspname || '.' || p.proname AS name
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname IN ('dbos', 'ledgerloop')
  AND EXISTS (
    SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
    WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
ORDER BY 1

-- name: public_functions_revoke
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA dbos, ledgerloop FROM PUBLIC
