//! SVG plots of the reports: latency percentiles per phase and the proxy's RSS over a run, drawn
//! with plotters' SVG backend. Text goes into the document as SVG `<text>` for the viewer's fonts
//! (plotters' built-in size estimate lays it out), so no font library or system package is needed.
//! The drawing functions are pure: each returns one SVG document; [`write_all`] puts them in a
//! directory.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::LoadgenError;
use crate::report::RssPoint;
use crate::stats::Summary;

/// Width and height of every plot, in SVG user units.
pub const SIZE: (u32, u32) = (800, 450);

/// The percentiles on the x axis of [`percentiles`], in order.
pub const PERCENTILES: [&str; 3] = ["p50", "p90", "p99"];

/// Line colours, in order: readable on white and told apart in print.
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// One plot: the file name it is written under and the SVG document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plot {
    pub file: String,
    pub svg: String,
}

type DrawResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn plot_error(
    what: &'static str,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> LoadgenError {
    move |e| LoadgenError::Plot {
        what,
        detail: e.to_string(),
    }
}

/// p50, p90 and p99 (x) of each named sample (one line each, in a legend), in milliseconds (y).
/// Samples without figures are left out by the caller.
pub fn percentiles(
    title: &str,
    y_label: &str,
    series: &[(&str, Summary)],
) -> Result<String, LoadgenError> {
    let mut svg = String::new();
    draw_percentiles(&mut svg, title, y_label, series).map_err(plot_error("a percentile plot"))?;
    Ok(svg)
}

fn draw_percentiles(
    svg: &mut String,
    title: &str,
    y_label: &str,
    series: &[(&str, Summary)],
) -> DrawResult {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let top = series
        .iter()
        .map(|(_, s)| s.p99)
        .fold(0.0_f64, f64::max)
        .max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d((0u32..2u32).into_segmented(), 0.0..top * 1.1)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("percentile")
        .y_desc(y_label)
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => PERCENTILES
                .get(*i as usize)
                .copied()
                .unwrap_or_default()
                .to_owned(),
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    for (i, (name, s)) in series.iter().enumerate() {
        let colour = colour(i);
        let points = [s.p50, s.p90, s.p99]
            .into_iter()
            .enumerate()
            .map(|(k, v)| (SegmentValue::CenterOf(k as u32), v));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)).point_size(4))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The proxy's RSS (MiB, y) over the run (seconds, x), with the baseline as a flat reference line
/// when given.
pub fn rss(
    title: &str,
    series: &[RssPoint],
    baseline_kib: Option<u64>,
) -> Result<String, LoadgenError> {
    let mut svg = String::new();
    draw_rss(&mut svg, title, series, baseline_kib).map_err(plot_error("the RSS plot"))?;
    Ok(svg)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn draw_rss(
    svg: &mut String,
    title: &str,
    series: &[RssPoint],
    baseline_kib: Option<u64>,
) -> DrawResult {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let right = series
        .iter()
        .map(|p| p.t_s)
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let top = series
        .iter()
        .map(|p| p.rss_kib)
        .chain(baseline_kib)
        .max()
        .map_or(1.0, mib)
        .max(1.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..right, 0.0..top * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("proxy RSS (MiB)")
        .draw()?;
    let colour = colour(0);
    chart
        .draw_series(LineSeries::new(
            series.iter().map(|p| (p.t_s, mib(p.rss_kib))),
            colour.stroke_width(2),
        ))?
        .label("RSS")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    if let Some(base) = baseline_kib {
        let grey = RGBColor(128, 128, 128);
        chart
            .draw_series(LineSeries::new(
                [(0.0, mib(base)), (right, mib(base))],
                grey,
            ))?
            .label("baseline")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The file-name stem of a run's plots: what it ran, at which upstream latency.
pub fn stem(what: &str, fake_latency_ms: f64) -> String {
    format!("{what}-{fake_latency_ms:.0}ms")
}

/// The latency and added-latency plots of a run's phases: `<stem>-latency.svg` (every phase) and
/// `<stem>-added.svg` (the proxied phases' added latency), each left out when it has no figures.
pub fn phase_plots(
    stem: &str,
    title: &str,
    phases: &[&crate::report::PhaseReport],
) -> Result<Vec<Plot>, LoadgenError> {
    let latency: Vec<(&str, Summary)> = phases
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.latency_ms?)))
        .collect();
    let added: Vec<(&str, Summary)> = phases
        .iter()
        .filter(|p| p.via_proxy)
        .filter_map(|p| Some((p.name.as_str(), p.added_ms?)))
        .collect();
    let mut plots = Vec::new();
    if !latency.is_empty() {
        plots.push(Plot {
            file: format!("{stem}-latency.svg"),
            svg: percentiles(
                &format!("{title}: latency per phase"),
                "latency (ms)",
                &latency,
            )?,
        });
    }
    if !added.is_empty() {
        plots.push(Plot {
            file: format!("{stem}-added.svg"),
            svg: percentiles(
                &format!("{title}: latency the proxy adds"),
                "added latency (ms)",
                &added,
            )?,
        });
    }
    Ok(plots)
}

/// Writes each plot into `dir` (created if missing); returns the paths written.
pub fn write_all(dir: &Path, plots: &[Plot]) -> Result<Vec<PathBuf>, LoadgenError> {
    std::fs::create_dir_all(dir).map_err(|source| LoadgenError::Io {
        context: format!("creating {}", dir.display()),
        source,
    })?;
    plots
        .iter()
        .map(|plot| {
            let path = dir.join(&plot.file);
            std::fs::write(&path, &plot.svg).map_err(|source| LoadgenError::Io {
                context: format!("writing {}", path.display()),
                source,
            })?;
            Ok(path)
        })
        .collect()
}

// The reports' plots live here, beside the drawing, so that `report` (the data) does not depend on
// `plot` (its pictures).
impl crate::report::Report {
    /// The SVG plots of the run: latency percentiles per phase and the proxied phases' added
    /// latency (`chat-<sessions>x<turns>-<upstream>ms-{latency,added}.svg`).
    pub fn plots(&self) -> Result<Vec<Plot>, LoadgenError> {
        let c = &self.config;
        let what = format!("chat-{}x{}", c.sessions, c.turns);
        let title = format!(
            "chat, {} sessions x {} turns, {:.0} ms upstream",
            c.sessions, c.turns, c.fake_latency_ms
        );
        let phases: Vec<&crate::report::PhaseReport> = self.phases.iter().collect();
        phase_plots(&stem(&what, c.fake_latency_ms), &title, &phases)
    }
}

impl crate::report::SoakReport {
    /// The SVG plots of the soak: latency percentiles of its phases, the added latency, and the
    /// proxy's RSS over the soak against its baseline (`soak-<upstream>ms-{latency,added,rss}.svg`).
    pub fn plots(&self) -> Result<Vec<Plot>, LoadgenError> {
        let c = &self.config;
        let stem = stem("soak", c.fake_latency_ms);
        let title = format!("soak, {} sessions", c.sessions);
        let phases: Vec<&crate::report::PhaseReport> =
            self.direct.iter().chain([&self.proxy]).collect();
        let mut plots = phase_plots(&stem, &title, &phases)?;
        plots.push(Plot {
            file: format!("{stem}-rss.svg"),
            svg: rss(
                &format!("{title}: proxy RSS over the soak"),
                &self.memory.series,
                Some(self.memory.baseline_kib),
            )?,
        });
        Ok(plots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(p50: f64, p90: f64, p99: f64) -> Summary {
        Summary {
            count: 100,
            mean: p50,
            p50,
            p90,
            p99,
            max: p99,
        }
    }

    /// The texts of every `<text>` element and the number of `<polyline>`s of a well-formed SVG.
    fn parse(svg: &str) -> (Vec<String>, usize) {
        let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or_default().trim().to_owned())
            .collect();
        let lines = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .count();
        (texts, lines)
    }

    #[test]
    fn percentile_plot_has_a_line_and_a_legend_entry_per_phase() {
        let svg = percentiles(
            "chat: latency per phase",
            "latency (ms)",
            &[
                ("direct", summary(1.0, 2.0, 3.0)),
                ("proxy", summary(1.5, 2.5, 4.0)),
                ("proxy-page", summary(1.6, 2.6, 4.2)),
            ],
        )
        .expect("drawn");
        let (texts, lines) = parse(&svg);
        for want in [
            "chat: latency per phase",
            "direct",
            "proxy",
            "proxy-page",
            "p50",
            "p90",
            "p99",
            "latency (ms)",
        ] {
            assert!(
                texts.iter().any(|t| t == want),
                "no text {want:?} in {texts:?}"
            );
        }
        // One polyline per phase (the legend's samples are paths of two points, also polylines).
        assert!(lines >= 3, "{lines} polylines");
        // Each phase's line goes through its three percentiles: 3 circles each.
        assert_eq!(svg.matches("<circle").count(), 9, "{svg}");
    }

    #[test]
    fn rss_plot_has_the_series_and_the_baseline() {
        let series: Vec<RssPoint> = (0..20)
            .map(|i| RssPoint {
                t_s: f64::from(i),
                turns: i as usize * 10,
                rss_kib: 100_000 + i as u64 * 1_000,
            })
            .collect();
        let svg = rss("soak: proxy RSS", &series, Some(100_000)).expect("drawn");
        let (texts, _) = parse(&svg);
        for want in [
            "soak: proxy RSS",
            "RSS",
            "baseline",
            "seconds",
            "proxy RSS (MiB)",
        ] {
            assert!(
                texts.iter().any(|t| t == want),
                "no text {want:?} in {texts:?}"
            );
        }
        let doc = roxmltree::Document::parse(&svg).expect("well-formed");
        let longest = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .filter_map(|n| n.attribute("points"))
            .map(|p| p.split_whitespace().count())
            .max();
        assert_eq!(
            longest,
            Some(series.len()),
            "the RSS line has one point per reading"
        );
    }

    #[test]
    fn an_empty_series_still_draws_a_valid_document() {
        let (texts, _) = parse(&rss("empty", &[], None).expect("drawn"));
        assert!(texts.iter().any(|t| t == "empty"));
        let (texts, _) = parse(&percentiles("none", "ms", &[]).expect("drawn"));
        assert!(texts.iter().any(|t| t == "none"));
    }

    #[test]
    fn plots_are_written_under_their_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plots = vec![Plot {
            file: "a-latency.svg".into(),
            svg: percentiles("a", "ms", &[("direct", summary(1.0, 2.0, 3.0))]).expect("drawn"),
        }];
        let target = dir.path().join("img");
        let written = write_all(&target, &plots).expect("written");
        assert_eq!(written, vec![target.join("a-latency.svg")]);
        let back = std::fs::read_to_string(&written[0]).expect("read");
        assert_eq!(back, plots[0].svg);
        assert_eq!(stem("chat", 200.0), "chat-200ms");
    }
}
