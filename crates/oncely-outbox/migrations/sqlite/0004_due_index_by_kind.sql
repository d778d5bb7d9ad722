-- Claims by kind: the due index leads with the kind (as on PostgreSQL), so a backlog of a kind
-- that no running worker handles is not walked by the claims of other kinds.
CREATE INDEX oncely_outbox_due_by_kind ON oncely_outbox (kind, run_after, id) WHERE status = 'pending';
DROP INDEX oncely_outbox_due;
