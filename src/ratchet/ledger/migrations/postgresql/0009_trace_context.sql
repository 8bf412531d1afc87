-- Ratchet ledger (PostgreSQL): the submitter's trace context travels with the task (DESIGN §9).
-- Additive only: processes of the previous release keep working (they name no new column;
-- their tasks get NULL, and their claims do not return it).
--
-- * tasks.trace_context: the W3C trace context of the submit span (a JSON object with
--   "traceparent" and, if any, "tracestate"), NULL when the submitter was not tracing.
--   Every claim returns it, so each attempt's span links to the submit span.

ALTER TABLE tasks ADD COLUMN trace_context text;
