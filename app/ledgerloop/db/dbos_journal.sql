-- DBOS's journal check, in one statement (db/dbos_journal.py, the DBOS internal
-- `journal-check`).

-- name: journal_check
-- The workflow's status and the operation recorded at function_id, if any: what DBOS's
-- check_operation_execution reads in two SELECTs inside BEGIN ... COMMIT.
SELECT s.status,
       o.function_id IS NOT NULL AS recorded,
       o.output,
       o.error,
       o.function_name,
       o.child_workflow_id,
       o.serialization
FROM dbos.workflow_status s
LEFT JOIN dbos.operation_outputs o
  ON o.workflow_uuid = s.workflow_uuid AND o.function_id = %(function_id)s
WHERE s.workflow_uuid = %(workflow_id)s
