// pg-boss draining no-op jobs: a worker-drain baseline of bench/run (the same 20,000 no-op
// jobs as oncely's `drain`, on the same PostgreSQL server, in a database of its own).
//
//   node drain.js seed URL N   creates pg-boss's schema and the queue `noop`, inserts N jobs
//   node drain.js run URL      works `noop` with a no-op handler until no job of it is left
//                              unfinished (in any process), then exits; prints one JSON line
//
// pg-boss 10 (the newest that runs on Node 20; 11 and 12 need Node 22) has no `teamSize` or
// `localConcurrency`: a worker fetches `batchSize` jobs in one statement (FOR UPDATE SKIP
// LOCKED), hands them to the handler as an array and completes them in one statement; the
// concurrency of a process is the number of `work()` calls. A worker loop whose fetch and
// handler took less than its polling interval (at least 0.5 s) sleeps the rest of it, so the
// batch must be large for a fast drain.
//
// The settings (environment): PGBOSS_BATCH (batchSize), PGBOSS_WORKERS (work() calls per
// process), PGBOSS_POLL (pollingIntervalSeconds). BEST: batchSize 2500 and 8 work() loops in
// all — bench/run runs 8 per process with 1 process and 4 each with 2. Measured here (2 cores,
// PostgreSQL 15, 20,000 jobs, 2026-12-02, a busy machine: ±20 % between repeats), jobs/s:
//   1 process:  2500 × 8 ≈ 10,300; 5000 × 4 ≈ 9,800; 10000 × 2 ≈ 9,300; 20000 × 1 ≈ 8,600;
//               1000 × 16 ≈ 7,300; 1000 × 4 ≈ 7,100; 500 × 8 ≈ 6,100
//   2 processes (per process): 2500 × 4 ≈ 7,500; 5000 × 2 ≈ 7,400; 10000 × 1 ≈ 7,500;
//               1250 × 8 ≈ 6,000; 2500 × 8 ≈ 6,500
// The seed ANALYZEs the table, as a table in service has statistics: without, the completion
// statement (`id IN (SELECT UNNEST($2::uuid[]))`) took seconds per batch in some settings
// (2500 × 8: 600 jobs/s; 1000 × 4: 1,300).
const PgBoss = require('pg-boss')

const QUEUE = 'noop'
const batchSize = Number(process.env.PGBOSS_BATCH || 2500)
const workers = Number(process.env.PGBOSS_WORKERS || 8)
const pollingIntervalSeconds = Number(process.env.PGBOSS_POLL || 0.5)

async function main () {
  const [command, url, n] = process.argv.slice(2)
  if (!url || !['seed', 'run'].includes(command)) {
    throw new Error('usage: node drain.js seed URL N | node drain.js run URL')
  }
  if (command === 'seed') {
    const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false })
    boss.on('error', e => console.error(e))
    await boss.start()
    await boss.createQueue(QUEUE)
    const total = Number(n)
    for (let done = 0; done < total; done += 5000) {
      const jobs = Array.from({ length: Math.min(5000, total - done) }, () => ({ name: QUEUE, data: {} }))
      await boss.insert(jobs)
    }
    // Statistics, as a table in service has them (see above).
    await boss.getDb().executeSql('ANALYZE pgboss.job', [])
    await boss.stop({ graceful: false, wait: true })
    console.log(JSON.stringify({ seeded: total }))
    return
  }
  // A worker process: no maintenance, no cron, no migration (the seed made the schema).
  const started = process.hrtime.bigint()
  const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false, migrate: false, max: workers + 2 })
  boss.on('error', e => console.error(e))
  await boss.start()
  let handled = 0
  for (let i = 0; i < workers; i++) {
    await boss.work(QUEUE, { batchSize, pollingIntervalSeconds }, async jobs => { handled += jobs.length })
  }
  // Done when no job of the queue is unfinished: created, retry or active (pg-boss completes
  // a batch without waiting, so "active" covers batches whose completion is in flight).
  const db = boss.getDb()
  for (;;) {
    const { rows } = await db.executeSql(
      "SELECT EXISTS (SELECT 1 FROM pgboss.job WHERE name = $1 AND state < 'completed') AS left", [QUEUE])
    if (!rows[0].left) break
    await new Promise(resolve => setTimeout(resolve, 20))
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9
  console.log(JSON.stringify({ jobs: handled, seconds, batchSize, workers, pollingIntervalSeconds }))
  process.exit(0)
}

main().catch(e => { console.error(e); process.exit(1) })
