-- A resumed execution's view of its own journal, for the turn boundaries (agent.messages).
-- DBOS 3.4's columns, like tracing.sql's.

-- name: journal_message_steps
-- How far the journal reached (a recv's timeout record does not count, as in tracing.sql),
-- and the message steps it holds: a replay takes messages exactly where the run took them.
SELECT coalesce(max(function_id) FILTER (WHERE function_name <> 'DBOS.sleep'), 0)
         AS journal_end,
       coalesce(array_agg(function_name) FILTER (WHERE function_name LIKE '%%messages-%%'),
                '{}') AS taken_at
FROM dbos.operation_outputs
WHERE workflow_uuid = %(workflow_id)s
