-- Ratchet ledger (PostgreSQL): a failure's traceback is kept apart from its message
-- (DESIGN §9). Additive only: processes of the previous release keep working (they name no
-- new column; what they record stays a traceback in last_error, shown by its last line).
--
-- * tasks.last_traceback: the traceback of last_error (NULL when it has none); last_error
--   holds the exception's type and message.

ALTER TABLE tasks ADD COLUMN last_traceback text;
