//! SVG plots (plotters, SVG backend only, no font files needed):
//!
//! * `throughput.svg`: per configuration, each queue's throughput as a ratio
//!   against crossbeam (left, line at 1.0) and in events/s (right, context);
//! * `latency.svg`: the distribution (CDF, log time axis) of every
//!   ping-pong method's round trips, all repetitions pooled;
//! * `flow_throughput.svg`: per load and consumer, events/s handled and
//!   mean latency as ratios against pure upcalls, and upcalls per event;
//! * `flow_latency.svg`: the distribution of post-to-handler latency at low
//!   load per consumer;
//! * `loopback_bandwidth.svg`: GB/s against transfer size (log₂ axis) of
//!   loopback RDMA write and read and of memcpy in both directions (left),
//!   and the ratio rdapl/memcpy with the 0.90 target line (right);
//! * `loopback_latency.svg`: the distribution of the 64-byte half round
//!   trip of every loopback and crossbeam ping-pong method;
//! * `tcp_latency.svg`: the TCP provider's 64-byte one-way latency as a
//!   ratio against its peer (fi_pingpong polling, qperf waiting; line at
//!   1.0), and every program's µs;
//! * `tcp_bandwidth.svg`: per size, the TCP provider's ping-pong bandwidth
//!   ÷ fi_pingpong's and streaming bandwidth ÷ qperf tcp_bw's (line at 1.0;
//!   the streaming target is 0.95), and every program's MB/s.

use crate::stats::cdf_points;
use crate::{flow, latency, loopback, tcp, throughput};
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use std::error::Error;
use std::path::Path;

type Res = Result<(), Box<dyn Error>>;

/// One bar series: a name and one value per group (NaN: no bar).
struct Series {
    name: String,
    values: Vec<f64>,
}

fn color(k: usize) -> RGBColor {
    const C: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    C[k % C.len()]
}

/// A chart builder on `area` with the common caption and margin.
fn chart_on<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    x_label_area: u32,
    y_label_area: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(x_label_area)
        .y_label_area_size(y_label_area);
    b
}

/// Draws the series legend at `position`.
fn draw_legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Res {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// The largest finite value (at least `reference`, and above zero).
fn finite_max(values: impl Iterator<Item = f64>, reference: Option<f64>) -> f64 {
    values
        .filter(|v| v.is_finite())
        .fold(reference.unwrap_or(0.0), f64::max)
        .max(1e-9)
}

/// Writes the SVG `name` in `dir`, `size` pixels, white, drawn by `draw`.
fn svg_file(
    dir: &Path,
    name: &str,
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Res,
) -> Res {
    let path = dir.join(name);
    let root = SVGBackend::new(&path, size).into_drawing_area();
    root.fill(&WHITE)?;
    draw(&root)?;
    root.present()?;
    Ok(())
}

/// Writes the CDF plot `name` in `dir` of every pooled, sorted sample set,
/// named by `label`.
fn cdf_file<T>(
    dir: &Path,
    name: &str,
    title: &str,
    x_desc: &str,
    pooled: &[(T, Vec<u64>)],
    label: impl Fn(&T) -> &'static str,
) -> Res {
    let series: Vec<(String, Vec<u64>)> = pooled
        .iter()
        .map(|(m, v)| (label(m).to_string(), v.clone()))
        .collect();
    svg_file(dir, name, (900, 560), |root| {
        cdf_chart(root, title, x_desc, &series)
    })
}

fn grouped_bars(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[Series],
    reference: Option<f64>,
    y_fmt: &dyn Fn(&f64) -> String,
) -> Res {
    let ns = series.len() as u32;
    let stride = ns + 1;
    let total = groups.len() as u32 * stride;
    let ymax = finite_max(
        series.iter().flat_map(|s| s.values.iter().copied()),
        reference,
    ) * 1.3;
    let mut chart = chart_on(area, title, 36, 70)
        .build_cartesian_2d((0u32..total).into_segmented(), 0f64..ymax)?;
    let names: Vec<String> = groups.to_vec();
    let centre = ns / 2;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(total as usize)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(j) if j % stride == centre => names
                .get((j / stride) as usize)
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc(y_desc)
        .y_label_formatter(y_fmt)
        .draw()?;
    for (k, s) in series.iter().enumerate() {
        let c = color(k);
        chart
            .draw_series(
                Histogram::vertical(&chart)
                    .style(c.filled())
                    .margin(1)
                    .data(
                        s.values
                            .iter()
                            .enumerate()
                            .filter(|(_, v)| v.is_finite())
                            .map(|(g, v)| (g as u32 * stride + k as u32, *v)),
                    ),
            )?
            .label(s.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    if let Some(r) = reference {
        chart.draw_series(LineSeries::new(
            [
                (SegmentValue::Exact(0u32), r),
                (SegmentValue::Exact(total), r),
            ],
            BLACK.stroke_width(1),
        ))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn cdf_chart(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    x_desc: &str,
    series: &[(String, Vec<u64>)],
) -> Res {
    let pts: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(n, v)| {
            let p = cdf_points(v, 400)
                .into_iter()
                .map(|(x, y)| (x.max(1.0) / 1000.0, y))
                .collect();
            (n.clone(), p)
        })
        .collect();
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for (_, p) in &pts {
        for (x, _) in p {
            lo = lo.min(*x);
            hi = hi.max(*x);
        }
    }
    if !lo.is_finite() || hi <= 0.0 {
        lo = 0.01;
        hi = 1.0;
    }
    let lo = (lo * 0.8).max(0.001);
    let hi = (hi * 1.25).max(lo * 10.0);
    let mut chart =
        chart_on(area, title, 40, 60).build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("fraction of samples ≤ x")
        .x_label_formatter(&|v| format!("{v}"))
        .draw()?;
    for (k, (name, p)) in pts.iter().enumerate() {
        if p.is_empty() {
            continue;
        }
        let c = color(k);
        chart
            .draw_series(LineSeries::new(p.iter().copied(), c.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Writes `throughput.svg`.
pub fn throughput(dir: &Path, rows: &[throughput::Row]) -> Result<String, Box<dyn Error>> {
    let name = "throughput.svg";
    let path = dir.join(name);
    let root = SVGBackend::new(&path, (1400, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let groups: Vec<String> = throughput::Config::ALL.iter().map(|c| c.name()).collect();
    let series_of = |get: &dyn Fn(&throughput::Row) -> f64| -> Vec<Series> {
        throughput::Queue::ALL
            .iter()
            .map(|q| Series {
                name: q.name().into(),
                values: throughput::Config::ALL
                    .iter()
                    .map(|c| {
                        rows.iter()
                            .find(|r| {
                                r.queue == *q
                                    && r.producers == c.producers
                                    && r.consumption == c.consumption
                            })
                            .map(get)
                            .unwrap_or(f64::NAN)
                    })
                    .collect(),
            })
            .collect()
    };
    grouped_bars(
        &left,
        "Throughput ÷ crossbeam, same run (higher is better)",
        "ratio vs crossbeam (median)",
        &groups,
        &series_of(&|r| r.ratio_vs_peer.median),
        Some(1.0),
        &|v| format!("{v:.1}"),
    )?;
    grouped_bars(
        &right,
        "Throughput, events/s (context)",
        "events/s (median)",
        &groups,
        &series_of(&|r| r.events_per_s.median),
        None,
        &|v| format!("{:.0} M", v / 1e6),
    )?;
    root.present()?;
    Ok(name.into())
}

/// Writes `latency.svg`.
pub fn latency(
    dir: &Path,
    pooled: &[(latency::Method, Vec<u64>)],
) -> Result<String, Box<dyn Error>> {
    let name = "latency.svg";
    cdf_file(
        dir,
        name,
        "Ping-pong round trip: distribution (all repetitions)",
        "round trip, µs (log)",
        pooled,
        |m| m.name(),
    )?;
    Ok(name.into())
}

/// Writes `flow_throughput.svg` and `flow_latency.svg`.
pub fn flow(dir: &Path, out: &flow::Output) -> Result<Vec<String>, Box<dyn Error>> {
    let tname = "flow_throughput.svg";
    let path = dir.join(tname);
    let root = SVGBackend::new(&path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 3));
    let groups: Vec<String> = flow::Load::ALL
        .iter()
        .map(|l| l.name().to_string())
        .collect();
    let series_of = |get: &dyn Fn(&flow::Row) -> f64| -> Vec<Series> {
        flow::Consumer::ALL
            .iter()
            .map(|c| Series {
                name: c.name().into(),
                values: flow::Load::ALL
                    .iter()
                    .map(|l| {
                        out.rows
                            .iter()
                            .find(|r| r.consumer == *c && r.load == *l)
                            .map(get)
                            .unwrap_or(f64::NAN)
                    })
                    .collect(),
            })
            .collect()
    };
    type Get<'a> = &'a dyn Fn(&flow::Row) -> f64;
    let charts: [(&str, &str, Get<'_>, f64); 3] = [
        (
            "Events/s handled ÷ pure-upcall, same run",
            "ratio vs pure-upcall (median)",
            &|r| r.ratio_events_vs_peer.median,
            1.0,
        ),
        (
            "Upcalls per event (line: 0.1 = 10x fewer)",
            "upcalls / event (median)",
            &|r| r.upcalls_per_event.median,
            0.1,
        ),
        (
            "Mean latency ÷ pure-upcall (line: 1.5)",
            "ratio vs pure-upcall (median)",
            &|r| r.ratio_mean_latency_vs_peer.median,
            1.5,
        ),
    ];
    for (panel, (title, y_desc, get, reference)) in panels.iter().zip(charts) {
        grouped_bars(
            panel,
            title,
            y_desc,
            &groups,
            &series_of(get),
            Some(reference),
            &|v| format!("{v:.1}"),
        )?;
    }
    root.present()?;

    let lname = "flow_latency.svg";
    cdf_file(
        dir,
        lname,
        "Seed's flow at low load: complete → handler latency",
        "latency, µs (log)",
        &out.low_load_latencies,
        |c| c.name(),
    )?;
    Ok(vec![tname.into(), lname.into()])
}

/// Lines of (x, y) points with a marker at each point, on a log₂ size axis.
fn size_lines(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    reference: Option<f64>,
    legend: SeriesLabelPosition,
) -> Res {
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let (xlo, xhi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let (xlo, xhi) = if xlo.is_finite() {
        (xlo - 0.5, xhi + 0.5)
    } else {
        (11.5, 24.5)
    };
    let ymax = finite_max(
        series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)),
        reference,
    ) * 1.2;
    let mut chart = chart_on(area, title, 40, 60).build_cartesian_2d(xlo..xhi, 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_labels(((xhi - xlo) as usize).max(2) + 1)
        .max_light_lines(1)
        .x_desc("transfer size (log₂)")
        .x_label_formatter(&|v| {
            if v.fract() == 0.0 && *v >= 0.0 && *v < 63.0 {
                loopback::size_label(1usize << (*v as u32))
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()?;
    for (k, (name, pts)) in series.iter().enumerate() {
        let c = color(k);
        let pts: Vec<(f64, f64)> = pts.iter().copied().filter(|p| p.1.is_finite()).collect();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
    }
    if let Some(r) = reference {
        chart.draw_series(LineSeries::new([(xlo, r), (xhi, r)], BLACK.stroke_width(1)))?;
    }
    draw_legend(&mut chart, legend)
}

/// Writes `loopback_bandwidth.svg` and `loopback_latency.svg`.
pub fn loopback(dir: &Path, out: &loopback::Output) -> Result<Vec<String>, Box<dyn Error>> {
    let mut written = Vec::new();
    if !out.bandwidth.is_empty() {
        let name = "loopback_bandwidth.svg";
        let path = dir.join(name);
        let root = SVGBackend::new(&path, (1400, 540)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(700);
        let line = |t: loopback::Transfer, get: &dyn Fn(&loopback::BandwidthRow) -> f64| {
            out.bandwidth
                .iter()
                .filter(|r| r.transfer == t && r.size > 0)
                .map(|r| ((r.size as f64).log2(), get(r)))
                .collect::<Vec<_>>()
        };
        let label = |t: loopback::Transfer| match t {
            loopback::Transfer::RdmaWrite => "rdapl RDMA write".to_string(),
            loopback::Transfer::RdmaRead => "rdapl RDMA read".to_string(),
            loopback::Transfer::MemcpyWrite => "memcpy a→b (peer of write)".to_string(),
            loopback::Transfer::MemcpyRead => "memcpy b→a (peer of read)".to_string(),
        };
        let gb: Vec<(String, Vec<(f64, f64)>)> = loopback::Transfer::ALL
            .iter()
            .map(|t| (label(*t), line(*t, &|r| r.gb_per_s.median)))
            .collect();
        size_lines(
            &left,
            "Loopback bandwidth vs memcpy, same run",
            "GB/s (median)",
            &gb,
            None,
            SeriesLabelPosition::UpperRight,
        )?;
        let ratios: Vec<(String, Vec<(f64, f64)>)> = loopback::Transfer::ALL
            .iter()
            .filter(|t| t.is_rdma())
            .map(|t| (label(*t), line(*t, &|r| r.ratio_vs_memcpy.median)))
            .collect();
        size_lines(
            &right,
            "rdapl ÷ memcpy (line: 0.90 target, from 64KiB)",
            "ratio vs memcpy (median)",
            &ratios,
            Some(loopback::BANDWIDTH_BOUND),
            SeriesLabelPosition::LowerRight,
        )?;
        root.present()?;
        written.push(name.to_string());
    }
    if !out.pooled_half_rtt.is_empty() {
        let name = "loopback_latency.svg";
        cdf_file(
            dir,
            name,
            "Loopback 64-byte send/receive vs crossbeam: half round trip",
            "half round trip, µs (log)",
            &out.pooled_half_rtt,
            |m| m.name(),
        )?;
        written.push(name.to_string());
    }
    Ok(written)
}

/// Writes `tcp_latency.svg` and `tcp_bandwidth.svg` (those with rows).
pub fn tcp(dir: &Path, rows: &[tcp::Row]) -> Result<Vec<String>, Box<dyn Error>> {
    let mut written = Vec::new();
    let lat: Vec<&tcp::Row> = rows
        .iter()
        .filter(|r| r.test == tcp::Test::Latency)
        .collect();
    if !lat.is_empty() {
        let name = "tcp_latency.svg";
        let path = dir.join(name);
        let root = SVGBackend::new(&path, (1400, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(640);
        let subjects: Vec<&&tcp::Row> = lat.iter().filter(|r| r.peer.is_some()).collect();
        let groups: Vec<String> = subjects
            .iter()
            .map(|r| format!("{} / {}", r.program.name(), r.peer.map_or("", |p| p.name())))
            .collect();
        grouped_bars(
            &left,
            &format!(
                "{} one-way latency ÷ peer, same run (lower is better)",
                lat[0].size_label
            ),
            "ratio vs peer (median)",
            &groups,
            &[Series {
                name: "rdapl ÷ peer".into(),
                values: subjects.iter().map(|r| r.ratio_vs_peer.median).collect(),
            }],
            Some(1.0),
            &|v| format!("{v:.1}"),
        )?;
        grouped_bars(
            &right,
            "One-way latency, µs (context)",
            "µs (median)",
            &lat.iter()
                .map(|r| r.program.name().to_string())
                .collect::<Vec<_>>(),
            &[Series {
                name: "µs one-way".into(),
                values: lat.iter().map(|r| r.value.median).collect(),
            }],
            None,
            &|v| format!("{v:.0}"),
        )?;
        root.present()?;
        written.push(name.to_string());
    }
    let mut sizes: Vec<usize> = rows
        .iter()
        .filter(|r| r.test != tcp::Test::Latency)
        .map(|r| r.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    if !sizes.is_empty() {
        let name = "tcp_bandwidth.svg";
        let path = dir.join(name);
        let root = SVGBackend::new(&path, (1400, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(700);
        let groups: Vec<String> = sizes.iter().map(|s| tcp::size_label(*s)).collect();
        let kinds: Vec<(tcp::Test, tcp::Program)> = rows
            .iter()
            .filter(|r| r.test != tcp::Test::Latency)
            .map(|r| (r.test, r.program))
            .fold(Vec::new(), |mut v, k| {
                if !v.contains(&k) {
                    v.push(k);
                }
                v
            });
        let series = |subjects_only: bool, get: &dyn Fn(&tcp::Row) -> f64| -> Vec<Series> {
            kinds
                .iter()
                .filter(|(_, p)| !subjects_only || p.peer().is_some())
                .map(|(t, p)| Series {
                    name: format!(
                        "{} {}{}",
                        t.name(),
                        p.name(),
                        if subjects_only {
                            format!(" ÷ {}", p.peer().map_or("", |q| q.name()))
                        } else {
                            String::new()
                        }
                    ),
                    values: sizes
                        .iter()
                        .map(|s| {
                            rows.iter()
                                .find(|r| r.test == *t && r.program == *p && r.size == *s)
                                .map(get)
                                .unwrap_or(f64::NAN)
                        })
                        .collect(),
                })
                .collect()
        };
        grouped_bars(
            &left,
            "Bandwidth ÷ peer, same run (targets from 64KiB: ≥ 1.0 / ≥ 0.95)",
            "ratio vs peer (median)",
            &groups,
            &series(true, &|r| r.ratio_vs_peer.median),
            Some(1.0),
            &|v| format!("{v:.2}"),
        )?;
        grouped_bars(
            &right,
            "Bandwidth, MB/s (context)",
            "MB/s (median)",
            &groups,
            &series(false, &|r| r.value.median),
            None,
            &|v| format!("{v:.0}"),
        )?;
        root.present()?;
        written.push(name.to_string());
    }
    Ok(written)
}
