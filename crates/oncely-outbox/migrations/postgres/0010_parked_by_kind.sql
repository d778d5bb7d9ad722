-- Parked jobs by kind: a reconciler looks only at the kinds it can ask about, each in its own
-- range of this index, so parked jobs of other kinds (nobody can ask about them: they wait for
-- an operator) are never walked by its looks. It replaces oncely_outbox_parked, whose one range
-- held every kind; the backlog's count and age of parked jobs read this one as well. Parked
-- jobs are few: the index is small. (Built like 0009's, in the migration's transaction.)
CREATE INDEX oncely_outbox_parked_by_kind ON oncely_outbox (kind, run_after, id)
    WHERE status = 'unknown';
DROP INDEX oncely_outbox_parked;
