-- The point of no return of an attempt: the moment its message is handed over to the provider
-- (SMTP: after MAIL, RCPT and DATA were accepted, before the message's content is sent; HTTP:
-- before the request is sent). A claim by this release opens the attempt of a job whose
-- handler records that moment with point_of_no_return = 'ahead'; the worker writes 'passed'
-- (and handed_over_at), fenced by the claim's lease token, before anything of the message
-- leaves, and sends nothing if that write fails. So an attempt abandoned by its worker (killed
-- mid-attempt) while 'ahead' never reached the provider: its job is retried as an ordinary
-- retry, not parked. 'passed', or NULL — an attempt of an earlier release, or of a handler that
-- does not record the moment (the mark is unknown) — parks it as before, under a kind that
-- reconciles. Columns only (NULL in every existing row) and a NOT VALID check that they pass:
-- an earlier release still runs on a migrated database (its attempts are NULL: unknown).
ALTER TABLE oncely_outbox_attempts ADD COLUMN point_of_no_return text;
ALTER TABLE oncely_outbox_attempts ADD COLUMN handed_over_at timestamptz;
ALTER TABLE oncely_outbox_attempts ADD CONSTRAINT oncely_outbox_attempts_point_of_no_return_check
    CHECK (point_of_no_return IN ('ahead', 'passed')) NOT VALID;
