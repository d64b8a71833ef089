//! A PNG of a run's progress from `OUT/metrics.jsonl`: the mean training
//! reward over steps, and the eval accuracy at the steps where an eval ran.
//!
//! Each line of the metrics file is a JSON object with `step` (the step
//! number; 0 for an eval before training), `reward` (the step's mean reward; `null` is a gap) and, on
//! the lines of eval steps, `eval_accuracy` (a fraction, drawn against a
//! 0–1 axis on the right) or `eval_reward` (drawn against the reward axis).
//! A step logged twice (a resumed run logs the steps after its checkpoint
//! again) is drawn with its last line. Blank lines are skipped; a line
//! that is not such an object is an error naming the file and line.
//!
//! Text is drawn with DejaVu Sans embedded in the binary, so plotting needs
//! no system fonts. The PNG is written to a hidden temp file beside it and
//! renamed into place.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use serde_json::Value;

use crate::error::{Error, Result};

/// The PNG's size in pixels, (width, height).
pub const PLOT_SIZE: (u32, u32) = (1000, 500);

/// Colour of the training-reward line.
const REWARD_COLOR: RGBColor = RGBColor(31, 119, 180);
/// Colour of the eval line and points.
const EVAL_COLOR: RGBColor = RGBColor(214, 39, 40);
/// The family text is drawn in; [`register_font`] gives it DejaVu Sans.
const FONT: &str = "sans-serif";

/// Reads the metrics file `metrics_jsonl` and writes the plot to `png`
/// (size [`PLOT_SIZE`]): training reward and eval accuracy by step, axes
/// labelled, with a legend.
pub fn plot_metrics(metrics_jsonl: &Path, png: &Path) -> Result<()> {
    let metrics = read_metrics(metrics_jsonl)?;
    let (width, height) = PLOT_SIZE;
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    draw(&metrics, &mut rgb, PLOT_SIZE).map_err(|message| Error::Data {
        path: png.to_path_buf(),
        line: 0,
        message: format!("drawing the plot: {message}"),
    })?;
    write_png(png, &rgb, PLOT_SIZE)
}

/// The series of a metrics file, by step.
#[derive(Debug, Default)]
struct Metrics {
    reward: BTreeMap<u64, f64>,
    eval_accuracy: BTreeMap<u64, f64>,
    eval_reward: BTreeMap<u64, f64>,
}

fn read_metrics(path: &Path) -> Result<Metrics> {
    let err = |line: usize, message: String| Error::Data {
        path: path.to_path_buf(),
        line,
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| err(0, format!("opening: {e}")))?;
    let mut metrics = Metrics::default();
    let mut lines = 0;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| err(n, format!("reading: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line).map_err(|e| err(n, format!("not JSON: {e}")))?;
        let Value::Object(object) = value else {
            return Err(err(n, "not a JSON object".into()));
        };
        let step = match object.get("step") {
            Some(v) => v
                .as_u64()
                .ok_or_else(|| err(n, format!("`step` is {v}, not a step number")))?,
            None => return Err(err(n, "no `step`".into())),
        };
        let number = |key: &str| -> Result<Option<f64>> {
            match object.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| err(n, format!("`{key}` is {v}, not a number"))),
            }
        };
        let eval_accuracy = number("eval_accuracy")?;
        let eval_reward = number("eval_reward")?;
        let has_eval = object.contains_key("eval_accuracy") || object.contains_key("eval_reward");
        if !object.contains_key("reward") && !has_eval {
            return Err(err(n, "no `reward`".into()));
        }
        if let Some(r) = number("reward")? {
            metrics.reward.insert(step, r);
        }
        if let Some(a) = eval_accuracy {
            metrics.eval_accuracy.insert(step, a);
        }
        if let Some(r) = eval_reward {
            metrics.eval_reward.insert(step, r);
        }
        lines += 1;
    }
    if lines == 0 {
        return Err(err(0, "no metrics".into()));
    }
    Ok(metrics)
}

/// Gives the `sans-serif` family the embedded DejaVu Sans (once).
fn register_font() -> std::result::Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the embedded font does not load".into())
    }
}

/// `lo..hi` padded by 5% (a unit around a single value).
fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    if hi - lo < 1e-9 {
        return lo - 0.5..hi + 0.5;
    }
    let pad = (hi - lo) * 0.05;
    lo - pad..hi + pad
}

fn draw(metrics: &Metrics, rgb: &mut [u8], size: (u32, u32)) -> std::result::Result<(), String> {
    register_font()?;
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let points = |m: &BTreeMap<u64, f64>| m.iter().map(|(&s, &v)| (s, v)).collect::<Vec<_>>();
    let reward = points(&metrics.reward);
    // Accuracy goes on its own 0–1 axis; an eval reward shares the reward axis.
    let (accuracy, eval_reward) = if metrics.eval_accuracy.is_empty() {
        (Vec::new(), points(&metrics.eval_reward))
    } else {
        (points(&metrics.eval_accuracy), Vec::new())
    };

    let all = || reward.iter().chain(&accuracy).chain(&eval_reward);
    let (x_lo, x_hi) = all().fold((u64::MAX, 0), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let x_range = if x_hi > x_lo { x_lo..x_hi } else { x_lo..x_lo + 1 };
    let ys = reward.iter().chain(&eval_reward).map(|p| p.1);
    let (y_lo, y_hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let y_range = if y_lo <= y_hi { padded(y_lo, y_hi) } else { 0.0..1.0 };
    let acc_hi = accuracy.iter().fold(1.0f64, |hi, p| hi.max(p.1));
    let acc_lo = accuracy.iter().fold(0.0f64, |lo, p| lo.min(p.1));

    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("GRPO training: reward and eval by step", (FONT, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(70)
        .right_y_label_area_size(if accuracy.is_empty() { 0 } else { 70 })
        .build_cartesian_2d(x_range.clone(), y_range)
        .map_err(e)?
        .set_secondary_coord(x_range, acc_lo..acc_hi);
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("mean reward")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 18))
        .draw()
        .map_err(e)?;
    if !accuracy.is_empty() {
        chart
            .configure_secondary_axes()
            .y_desc("eval accuracy")
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 18))
            .draw()
            .map_err(e)?;
    }

    let line_legend =
        |color: RGBColor| move |(x, y): (i32, i32)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2));
    chart
        .draw_series(LineSeries::new(reward, REWARD_COLOR.stroke_width(2)))
        .map_err(e)?
        .label("train reward (mean)")
        .legend(line_legend(REWARD_COLOR));
    let eval_style = EVAL_COLOR.stroke_width(2);
    if !accuracy.is_empty() {
        chart
            .draw_secondary_series(LineSeries::new(accuracy.clone(), eval_style))
            .map_err(e)?;
        chart
            .draw_secondary_series(accuracy.iter().map(|&p| Circle::new(p, 4, EVAL_COLOR.filled())))
            .map_err(e)?
            .label("eval accuracy (right axis)")
            .legend(line_legend(EVAL_COLOR));
    }
    if !eval_reward.is_empty() {
        chart
            .draw_series(LineSeries::new(eval_reward.clone(), eval_style))
            .map_err(e)?;
        chart
            .draw_series(eval_reward.iter().map(|&p| Circle::new(p, 4, EVAL_COLOR.filled())))
            .map_err(e)?
            .label("eval reward (mean)")
            .legend(line_legend(EVAL_COLOR));
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Writes an RGB image as a PNG, whole or not at all.
fn write_png(path: &Path, rgb: &[u8], (width, height): (u32, u32)) -> Result<()> {
    let err = |message: String| Error::Data {
        path: path.to_path_buf(),
        line: 0,
        message,
    };
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut w| {
            w.write_image_data(rgb)?;
            w.finish()
        })
        .map_err(|e| err(format!("encoding: {e}")))?;
    crate::files::replace(path, &bytes).map_err(|e| err(format!("writing: {e}")))
}
