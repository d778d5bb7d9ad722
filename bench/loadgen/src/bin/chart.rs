//! Draws a results file of `bench/run` as a PNG: each scenario's ratio to its baseline measured
//! in the same run, with its target.
//!
//! `chart <results.json> <out.png>`. Text is drawn with a TrueType font from the system
//! (`BENCH_FONT`, else DejaVu Sans or the first `.ttf` under `/usr/share/fonts`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use serde_json::Value;

/// One bar: a label, the ratio (if measured) and its target (if any).
struct Bar {
    label: String,
    ratio: Option<f64>,
    target: Option<f64>,
}

/// Each bar: its label, the path of its ratio in the results file, its target.
const BARS: &[(&str, &[&str], Option<f64>)] = &[
    (
        "signup over HTTP / pgbench, same SQL",
        &["signup", "ratio"],
        Some(0.8),
    ),
    (
        "signup over HTTP / pgbench, a signup's rows only",
        &["signup_commit_limit", "one_address", "ratio"],
        Some(0.8),
    ),
    (
        "signups from many addresses / pgbench, a signup's rows only",
        &["signup_commit_limit", "source_addresses", "ratio"],
        Some(0.8),
    ),
    (
        "signups through a trusted proxy / the same baseline",
        &[
            "signup_commit_limit",
            "trusted_proxy_forwarded_for",
            "ratio",
        ],
        Some(0.8),
    ),
    (
        "password signups / argon2_loop hashes",
        &["passwords", "ratio"],
        Some(0.85),
    ),
    (
        "replay over HTTP / pgbench, PK lookup",
        &["replay", "ratio"],
        Some(0.5),
    ),
    (
        "worker drain / graphile-worker",
        &["worker", "drain_ratio_vs_graphile_worker"],
        Some(1.0),
    ),
    (
        "worker drain, 1 process / best peer",
        &["worker", "drain_ratio_vs_best_peer", "1_process"],
        Some(1.0),
    ),
    (
        "worker drain, 2 processes / best peer",
        &["worker", "drain_ratio_vs_best_peer", "2_processes"],
        Some(1.0),
    ),
    (
        "signup with the scale rows present / without",
        &["scale_expired_keys_sent_jobs", "signup_ratio"],
        Some(0.9),
    ),
    (
        "worker drain with them / without",
        &["scale_expired_keys_sent_jobs", "drain_ratio"],
        Some(0.9),
    ),
    (
        "signup while oncely prune runs / without",
        &["prune_under_signup_load", "signup_ratio"],
        Some(0.9),
    ),
    (
        "generic layer / same handler without it",
        &["layer_overhead", "ratio"],
        None,
    ),
    (
        "generic layer / pgbench, its claim + completion",
        &["layer_overhead", "ratio_vs_pgbench_layer"],
        Some(0.8),
    ),
];

fn bars(results: &Value) -> Vec<Bar> {
    BARS.iter()
        .map(|(label, path, target)| Bar {
            label: (*label).into(),
            ratio: path
                .iter()
                .try_fold(results, |v, k| v.get(k))
                .and_then(Value::as_f64),
            target: *target,
        })
        .collect()
}

fn font() -> anyhow::Result<Vec<u8>> {
    let chosen = match std::env::var_os("BENCH_FONT") {
        Some(path) => PathBuf::from(path),
        None => {
            let dejavu = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");
            if dejavu.exists() {
                dejavu.to_path_buf()
            } else {
                find_ttf(Path::new("/usr/share/fonts")).context(
                    "no TrueType font found: install one (Debian: fonts-dejavu-core) or set BENCH_FONT",
                )?
            }
        }
    };
    std::fs::read(&chosen).with_context(|| format!("cannot read font {}", chosen.display()))
}

fn find_ttf(dir: &Path) -> Option<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    entries.iter().find_map(|path| {
        if path.is_dir() {
            find_ttf(path)
        } else {
            (path.extension()? == "ttf").then(|| path.clone())
        }
    })
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: chart <results.json> <out.png>");
    };
    let results: Value = serde_json::from_str(
        &std::fs::read_to_string(input).with_context(|| format!("cannot read {input}"))?,
    )
    .with_context(|| format!("{input} is not a results file"))?;
    let font: &'static [u8] = Box::leak(font()?.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("the font could not be loaded"))?;
    let bars = bars(&results);
    draw(&bars, &results, Path::new(output))?;
    println!("wrote {output}");
    Ok(())
}

fn draw(bars: &[Bar], results: &Value, output: &Path) -> anyhow::Result<()> {
    // 640 px held the first 7 bars: the height grows with their number.
    let height = 640.max(120 + 75 * bars.len() as u32);
    let root = BitMapBackend::new(output, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = bars
        .iter()
        .flat_map(|b| [b.ratio, b.target])
        .flatten()
        .fold(1.2f64, f64::max)
        * 1.1;
    let caption = format!(
        "oncely / baseline, same run ({}, {}, {} clients)",
        results["date"].as_str().unwrap_or("?"),
        results["machine"].as_str().unwrap_or("?"),
        results["concurrency"]
    );
    let rows = bars.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(36)
        .build_cartesian_2d(0f64..x_max, 0f64..rows)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("ratio (higher is better); | marks the target")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, bar) in bars.iter().enumerate() {
        let top = rows - i as f64 - 0.3;
        let bottom = rows - i as f64 - 0.75;
        let met = match (bar.ratio, bar.target) {
            (Some(r), Some(t)) => r >= t,
            _ => true,
        };
        let color = if bar.target.is_none() {
            RGBColor(150, 150, 150)
        } else if met {
            RGBColor(46, 139, 87)
        } else {
            RGBColor(200, 60, 50)
        };
        let value = match bar.ratio {
            Some(r) => {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(0.0, bottom), (r, top)],
                    color.filled(),
                )))?;
                format!("{r:.2}")
            }
            None => "not measured".into(),
        };
        let label = format!("{}: {value}", bar.label);
        chart.draw_series(std::iter::once(Text::new(
            label,
            (0.01 * x_max, rows - i as f64 - 0.05),
            ("sans-serif", 15),
        )))?;
        if let Some(target) = bar.target {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(target, bottom - 0.08), (target, top + 0.08)],
                BLACK.stroke_width(3),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}
