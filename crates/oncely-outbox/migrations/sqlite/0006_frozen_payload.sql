-- What a job's first attempt froze (Handler::freeze), as JSON text: every retry under the job's
-- delivery key sends exactly that. Written once, before the first send, fenced by the claim's
-- lease token; NULL until then and for handlers that freeze nothing. Only adds a nullable
-- column: a previous release still runs on a migrated database.
ALTER TABLE oncely_outbox ADD COLUMN frozen TEXT;
