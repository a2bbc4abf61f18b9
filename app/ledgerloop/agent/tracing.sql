-- The loop's view of its own journal, for tracing a resumed run. DBOS 3.4's columns.

-- name: journal_end
-- How far the journal reached when a resumed execution started, and when it last grew: an
-- operation after it really runs in this execution, one before it is answered by the journal.
-- A recv's timeout is recorded (as DBOS.sleep, one id after the recv's) before it waits, so
-- those records do not count: a wait cut short by a crash or a hibernation did not happen.
SELECT coalesce(max(function_id) FILTER (WHERE function_name <> 'DBOS.sleep'), 0)
         AS journal_end,
       max(completed_at_epoch_ms) AS last_checkpoint_ms
FROM dbos.operation_outputs
WHERE workflow_uuid = %(workflow_id)s
