"""Turns bench/run's measurements into bench/results/<date>.json and the table in docs/benchmarks.md."""
import datetime
import json
import os
import pathlib
import platform
import sys

env = os.environ
load = {k: json.loads(env[k]) for k in ["SIGNUP", "REPLAY", "MIX", "PLAIN", "KEYED", "GW_NEW", "GW_PASS", "GW_REPLAY", "SCALE_BEFORE", "SCALE_AFTER", "DURING_PRUNE"]}
pg_signup, pg_replay = float(env["PG_SIGNUP"] or 0), float(env["PG_REPLAY"] or 0)
rss_mib = int(env["RSS_KB"] or 0) / 1024
gw_rss_mib = int(env["GW_RSS_KB"] or 0) / 1024


def ratio(a, b):
    return round(a / b, 3) if b else None


results = {
    "date": datetime.date.today().isoformat(),
    "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    "seconds_per_scenario": float(env["S"]),
    "concurrency": int(env["C"]),
    "signup": {"oncely": load["SIGNUP"], "pgbench_tps": pg_signup, "ratio": ratio(load["SIGNUP"]["rate"], pg_signup), "target": 0.8},
    "replay": {"oncely": load["REPLAY"], "pgbench_tps": pg_replay, "ratio": ratio(load["REPLAY"]["rate"], pg_replay), "target": 0.5},
    "mix_10pct_duplicates": load["MIX"],
    "layer_overhead": {"plain": load["PLAIN"], "keyed": load["KEYED"], "ratio": ratio(load["KEYED"]["rate"], load["PLAIN"]["rate"])},
    "serve_peak_rss_mib": round(rss_mib, 1),
    "gateway": {
        "new_keys": load["GW_NEW"], "pass_through": load["GW_PASS"], "replays": load["GW_REPLAY"],
        "new_keys_ratio_vs_direct": ratio(load["GW_NEW"]["rate"], load["PLAIN"]["rate"]),
        "pass_through_ratio_vs_direct": ratio(load["GW_PASS"]["rate"], load["PLAIN"]["rate"]),
        "replay_ratio_vs_pk_lookup": ratio(load["GW_REPLAY"]["rate"], pg_replay),
        "peak_rss_mib": round(gw_rss_mib, 1),
    },
    "worker": {
        "drain_20000_jobs_seconds": {"1_process": float(env["DRAIN_1"]), "2_processes": float(env["DRAIN_2"])},
        "drain_jobs_per_second": {"1_process": round(20000 / float(env["DRAIN_1"])), "2_processes": round(20000 / float(env["DRAIN_2"]))},
        "enqueue_to_start_latency_ms": json.loads(env["LATENCY"]),
        "graphile_worker_drain_seconds": float(env["GRAPHILE"]) if env.get("GRAPHILE") else None,
    },
}
before, after, pruning = load["SCALE_BEFORE"], load["SCALE_AFTER"], load["DURING_PRUNE"]
results["scale_1m_expired_keys_1m_sent_jobs"] = {
    "signup_before": before,
    "signup_after": after,
    "signup_ratio": ratio(after["rate"], before["rate"]),
    "signup_p50_ratio": ratio(before["p50_ms"], after["p50_ms"]),
    "drain_jobs_per_second_after": round(20000 / float(env["DRAIN_SCALE"])),
    "drain_ratio": ratio(20000 / float(env["DRAIN_SCALE"]), 20000 / float(env["DRAIN_1"])),
    "target": 0.9,
}
results["prune_2m_rows_under_signup_load"] = {
    "prune_seconds": float(env["PRUNE_SECONDS"]),
    "signup_during": pruning,
    "signup_ratio": ratio(pruning["rate"], after["rate"]),
}
graphile = results["worker"]["graphile_worker_drain_seconds"]
graphile_rate = round(20000 / graphile) if graphile else None
results["worker"]["drain_ratio_vs_graphile_worker"] = ratio(results["worker"]["drain_jobs_per_second"]["1_process"], graphile_rate)
out = pathlib.Path("bench/results") / f"{results['date']}.json"
out.write_text(json.dumps(results, indent=2) + "\n")

def row(name, measured, baseline, r, target):
    verdict = "" if target is None or r is None else (" ✓" if r >= target else " ✗")
    shown = "—" if r is None else r
    return f"| {name} | {measured} | {baseline} | {shown}{verdict} | {target if target is not None else '—'} |"

s, rp, mx, pl, ky = load["SIGNUP"], load["REPLAY"], load["MIX"], load["PLAIN"], load["KEYED"]
gn, gp, gr, gw = load["GW_NEW"], load["GW_PASS"], load["GW_REPLAY"], results["gateway"]
table = "\n".join([
    f"Measured {results['date']} on {results['machine']}, {results['concurrency']} clients, {results['seconds_per_scenario']:.0f} s per scenario.",
    "",
    "| scenario | oncely | baseline (same run) | ratio | target |",
    "|---|---|---|---|---|",
    row("signup, new keys (req/s, over HTTP)", f"{s['rate']:.0f} (p99 {s['p99_ms']:.1f} ms)", f"pgbench, same SQL: {pg_signup:.0f} tps", results["signup"]["ratio"], 0.8),
    row("replay (req/s)", f"{rp['rate']:.0f} (p99 {rp['p99_ms']:.1f} ms)", f"pgbench, PK lookup: {pg_replay:.0f} tps", results["replay"]["ratio"], 0.5),
    row("signup with 10 % duplicates (req/s)", f"{mx['rate']:.0f}", "—", None, None),
    row("generic layer on a trivial handler (req/s)", f"{ky['rate']:.0f} (p99 {ky['p99_ms']:.1f} ms)", f"without the layer: {pl['rate']:.0f}", results["layer_overhead"]["ratio"], None),
    row("oncely gateway, new keys, trivial upstream route (req/s)", f"{gn['rate']:.0f} (p99 {gn['p99_ms']:.1f} ms)", f"straight to the upstream: {pl['rate']:.0f}", gw["new_keys_ratio_vs_direct"], None),
    row("oncely gateway, passed-through route (req/s)", f"{gp['rate']:.0f} (p99 {gp['p99_ms']:.1f} ms)", f"straight to the upstream: {pl['rate']:.0f}", gw["pass_through_ratio_vs_direct"], None),
    row("oncely gateway, replays (req/s)", f"{gr['rate']:.0f} (p99 {gr['p99_ms']:.1f} ms)", f"pgbench, PK lookup: {pg_replay:.0f} tps", gw["replay_ratio_vs_pk_lookup"], 0.5),
    row("peak RSS of oncely gateway under that load", f"{gw_rss_mib:.1f} MiB", "—", None, "≤ 64 MiB"),
    row("peak RSS of oncely serve under signup load", f"{rss_mib:.1f} MiB", "—", None, "≤ 64 MiB"),
    row("worker drain, 20,000 no-op jobs, 1 process (jobs/s)", results["worker"]["drain_jobs_per_second"]["1_process"],
        f"graphile-worker, 1 process, 16 jobs at once: {graphile_rate}" if graphile_rate else "graphile-worker: not run (no npm)",
        results["worker"]["drain_ratio_vs_graphile_worker"], 1.0),
    row("worker drain, 2 processes (jobs/s)", results["worker"]["drain_jobs_per_second"]["2_processes"], "—", None, None),
    row("signups with 1 M expired keys + 1 M sent jobs present (req/s)", f"{after['rate']:.0f} (p50 {after['p50_ms']:.1f} ms)",
        f"just before adding them: {before['rate']:.0f} (p50 {before['p50_ms']:.1f} ms)", results["scale_1m_expired_keys_1m_sent_jobs"]["signup_ratio"], 0.9),
    row("worker drain with them present (jobs/s)", results["scale_1m_expired_keys_1m_sent_jobs"]["drain_jobs_per_second_after"],
        f"without them: {results['worker']['drain_jobs_per_second']['1_process']}", results["scale_1m_expired_keys_1m_sent_jobs"]["drain_ratio"], 0.9),
    row(f"signups while `oncely prune` deletes the 2 M rows ({results['prune_2m_rows_under_signup_load']['prune_seconds']:.1f} s) (req/s)",
        f"{pruning['rate']:.0f} (p99 {pruning['p99_ms']:.1f} ms)", f"without pruning: {after['rate']:.0f} (p99 {after['p99_ms']:.1f} ms)",
        results["prune_2m_rows_under_signup_load"]["signup_ratio"], None),
    row("enqueue → handler start, idle worker (LISTEN/NOTIFY)", "p50 {p50_ms:.1f} / p95 {p95_ms:.1f} / p99 {p99_ms:.1f} ms".format(**results["worker"]["enqueue_to_start_latency_ms"]), "—", None, "p99 ≤ 50 ms"),
])
doc = pathlib.Path("docs/benchmarks.md")
text = doc.read_text()
start, end = "<!-- results:start -->", "<!-- results:end -->"
text = text[: text.index(start) + len(start)] + "\n" + table + "\n" + text[text.index(end):]
doc.write_text(text)
print(table, file=sys.stderr)
print(out)
