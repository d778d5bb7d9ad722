-- Pruning finished jobs by age: an index of finished rows only, by when they finished.
CREATE INDEX oncely_outbox_finished ON oncely_outbox ((COALESCE(sent_at, dead_at))) WHERE status <> 'pending';
