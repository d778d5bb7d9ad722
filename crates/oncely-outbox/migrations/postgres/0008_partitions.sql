-- Partitions: a job may name one (NewJob::partition: a webhook's endpoint), and a kind with a
-- per-partition limit (KindOptions::per_partition) runs at most that many jobs of one partition
-- at once in a worker. The claim of such a kind hops from partition to partition over this
-- index (one descent per partition that has pending jobs, however many it has) and takes the
-- oldest due jobs of each partition that has room, so a partition with a large backlog whose
-- jobs run slowly never keeps the kind's other partitions waiting. Only adds a nullable column
-- and an index: a previous release still runs on a migrated database (it neither reads nor
-- writes the column; its jobs have no partition).
ALTER TABLE oncely_outbox ADD COLUMN partition_key text;
CREATE INDEX oncely_outbox_due_by_partition ON oncely_outbox (kind, partition_key, run_after, id)
    WHERE status = 'pending';
