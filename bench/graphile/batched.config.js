// graphile-worker's batched settings (https://worker.graphile.org/docs/performance#batching):
// a local queue (one statement locks a batch of jobs, which the pool's workers take without a
// round trip each) and batched completion and failure (finished jobs deleted together after a
// short delay). bench/run passes it with `-C batched.config.js`; without it (the other
// baseline row), graphile-worker runs with its defaults.
//
// Environment overrides, for trying settings: GW_JOBS (concurrentJobs), GW_LOCAL_QUEUE
// (localQueue.size), GW_COMPLETE_DELAY (completeJobBatchDelay, ms), GW_FAIL_DELAY
// (failJobBatchDelay, ms), GW_POOL (maxPoolSize), GW_LOG=1 (graphile-worker's own logging).
//
// BEST (the defaults below): 16 jobs at once, a local queue of 1000, completions and failures
// batched with a delay of 0 ms (batched with whatever finished in the same tick). Measured here
// (graphile-worker 0.17.3 — 0.18 needs Node 22 —, 2 cores, PostgreSQL 15, 20,000 no-op jobs,
// 2026-12-02, a busy machine: ±20 % between repeats), jobs/s, 1 process:
//   jobs 16, queue 1000 ≈ 9,600; 64/1000 ≈ 9,400; 64/2000 ≈ 9,600; 16/500 ≈ 8,000;
//   32/1000 ≈ 7,900; 32/1000 with delay 10 ms ≈ 6,700; unbatched (queue and delays -1) ≈ 600
// 2 processes: 16/1000 ≈ 8,400; 64/1000 ≈ 7,300; 16/500 ≈ 7,100; 32/500 ≈ 6,400.
// Logging one line per job (the default logger) is off: it costs the peer throughput.
const { Logger } = require("graphile-worker");

const env = (name, fallback) => (process.env[name] === undefined ? fallback : Number(process.env[name]));

module.exports = {
  worker: {
    concurrentJobs: env("GW_JOBS", 16),
    maxPoolSize: env("GW_POOL", 10),
    localQueue: { size: env("GW_LOCAL_QUEUE", 1000) },
    completeJobBatchDelay: env("GW_COMPLETE_DELAY", 0),
    failJobBatchDelay: env("GW_FAIL_DELAY", 0),
    // Errors only, unless GW_LOG=1.
    ...(process.env.GW_LOG ? {} : { logger: new Logger(() => (level, message) => { if (level === "error") console.error(message); }) }),
  },
};
