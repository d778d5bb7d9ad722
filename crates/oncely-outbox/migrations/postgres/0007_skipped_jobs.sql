-- A job its handler chose not to run (a decoy with nobody to send to, an email over a cap) ends
-- 'skipped', not 'dead': dead lists only real failures, the ones an operator re-drives.
-- skipped_at: when it was skipped (sent_at and dead_at stay for their own statuses).
-- The jobs an earlier release made dead for a skip (their last attempt 'skipped') become skipped.
-- The prune index covers every finished job by when it finished, skipped ones included. (A
-- process of the previous release prunes sent and dead jobs still, by a scan instead of this
-- index; the skipped ones it leaves to this release.)
ALTER TABLE oncely_outbox DROP CONSTRAINT oncely_outbox_status_check;
ALTER TABLE oncely_outbox ADD COLUMN skipped_at timestamptz;
UPDATE oncely_outbox o
   SET status = 'skipped', skipped_at = o.dead_at, dead_at = NULL
 WHERE o.status = 'dead'
   AND (SELECT a.result FROM oncely_outbox_attempts a
         WHERE a.job_id = o.id ORDER BY a.id DESC LIMIT 1) = 'skipped';
ALTER TABLE oncely_outbox ADD CONSTRAINT oncely_outbox_status_check
    CHECK (status IN ('pending', 'sent', 'dead', 'skipped'));
DROP INDEX oncely_outbox_finished;
CREATE INDEX oncely_outbox_finished ON oncely_outbox ((COALESCE(sent_at, dead_at, skipped_at)))
    WHERE status <> 'pending';
