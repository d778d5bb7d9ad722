-- Claims by kind: the due index leads with the kind, and the claim walks it once per kind a
-- worker runs. A backlog of a kind no running worker handles (its workers are down, or run
-- elsewhere) is then never scanned by the claims of other kinds.
CREATE INDEX oncely_outbox_due_by_kind ON oncely_outbox (kind, run_after, id) WHERE status = 'pending';
DROP INDEX oncely_outbox_due;
