-- Ratchet ledger (PostgreSQL): autovacuum settings for the hot tables (DESIGN §10.1).
-- PostgreSQL only (SQLite has no vacuum of dead row versions to tune). Storage parameters
-- only: SHARE UPDATE EXCLUSIVE, so processes of the previous release go on reading and
-- writing while it runs; nothing they do changes.
--
-- A drain updates every task twice (claim, completion), each a new row version with an entry
-- in each index, and leaves the old ones dead: 200,000 tasks drained leave 400,000 dead
-- versions, which ratchet status and the dashboard read through (bitmap scans and counts
-- check every version; the visibility map, which index-only scans need, is set only by
-- VACUUM). With the default scale factors (20 % dead for a vacuum, 10 % changed for an
-- ANALYZE, 20 % inserted for a vacuum of an append-mostly table) a large ledger waits long
-- for either. These tables are vacuumed and analyzed after 2 % (tasks, audit) or 5 % (steps,
-- effects) of their rows changed, plus 1,000 rows, so a drain is cleaned up while it runs
-- and the planner has statistics for the table it produced. Autovacuum itself must be on
-- (the server's autovacuum setting; it cannot be turned on per table).

ALTER TABLE tasks SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                       autovacuum_vacuum_insert_scale_factor = 0.02,
                       autovacuum_vacuum_insert_threshold = 1000,
                       autovacuum_analyze_scale_factor = 0.02,
                       autovacuum_analyze_threshold = 1000);
ALTER TABLE audit SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                       autovacuum_vacuum_insert_scale_factor = 0.02,
                       autovacuum_vacuum_insert_threshold = 1000,
                       autovacuum_analyze_scale_factor = 0.02,
                       autovacuum_analyze_threshold = 1000);
ALTER TABLE steps SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 1000,
                       autovacuum_vacuum_insert_scale_factor = 0.05,
                       autovacuum_vacuum_insert_threshold = 1000,
                       autovacuum_analyze_scale_factor = 0.05,
                       autovacuum_analyze_threshold = 1000);
ALTER TABLE effects SET (autovacuum_vacuum_scale_factor = 0.05,
                         autovacuum_vacuum_threshold = 1000,
                         autovacuum_vacuum_insert_scale_factor = 0.05,
                         autovacuum_vacuum_insert_threshold = 1000,
                         autovacuum_analyze_scale_factor = 0.05,
                         autovacuum_analyze_threshold = 1000);
