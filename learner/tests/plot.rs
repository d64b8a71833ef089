//! The metrics plot: a real PNG of the right size with the reward line,
//! eval points and text drawn, written atomically; bad metrics lines are
//! errors naming the file and line.

use std::path::Path;

use grpo_learner::Error;
use grpo_learner::plot::{PLOT_SIZE, plot_metrics};

/// 30 training steps, an eval every 10 steps from step 0 (4 points); the
/// eval lines also carry the step's reward, as `grpo run` logs them.
fn metrics_30_steps() -> String {
    let mut text = String::new();
    for step in 0..30u32 {
        let reward = 0.1 + 0.02 * f64::from(step) + if step % 2 == 0 { 0.03 } else { -0.03 };
        let mut line = serde_json::json!({ "step": step, "reward": reward, "loss": 0.5, "lr": 1e-6 });
        if step % 10 == 0 || step == 29 {
            line["eval_accuracy"] = serde_json::json!(0.2 + 0.015 * f64::from(step));
        }
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}

/// The image decoded to RGB rows.
struct Image {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

impl Image {
    fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y * self.width + x) as usize * 3;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// Pixels in the rectangle `[x0, x1) × [y0, y1)` that `keep` selects.
    fn count(&self, (x0, x1): (u32, u32), (y0, y1): (u32, u32), keep: impl Fn([u8; 3]) -> bool) -> usize {
        (y0..y1)
            .flat_map(|y| (x0..x1).map(move |x| (x, y)))
            .filter(|&(x, y)| keep(self.pixel(x, y)))
            .count()
    }
}

fn decode(path: &Path) -> Image {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    Image {
        width: info.width,
        height: info.height,
        rgb: buf,
    }
}

fn not_white(p: [u8; 3]) -> bool {
    p != [255, 255, 255]
}
/// The reward line's blue (31, 119, 180), anti-aliasing allowed.
fn bluish(p: [u8; 3]) -> bool {
    p[2] > 140 && p[0] < 120 && p[2] as i32 - p[0] as i32 > 60
}
/// The eval colour's red (214, 39, 40).
fn reddish(p: [u8; 3]) -> bool {
    p[0] > 150 && p[1] < 110 && p[2] < 110
}

#[test]
fn thirty_steps_and_four_evals_make_a_drawn_png() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    std::fs::write(&metrics, metrics_30_steps()).unwrap();
    let png = dir.path().join("metrics.png");
    plot_metrics(&metrics, &png).unwrap();

    // The file itself: PNG signature, then IHDR first with the size.
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&bytes[12..16], b"IHDR");
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((width, height), (1000, 500));
    assert_eq!((width, height), PLOT_SIZE);

    // Nothing but the PNG in the folder: the temp file was renamed.
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["metrics.jsonl", "metrics.png"]);

    let image = decode(&png);
    assert_eq!((image.width, image.height), (1000, 500));
    // A white background…
    assert_eq!(image.pixel(2, 2), [255, 255, 255]);
    let total = image.count((0, 1000), (0, 500), |_| true);
    let inked = image.count((0, 1000), (0, 500), not_white);
    assert!(inked * 4 < total, "mostly white background: {inked} of {total} inked");
    // …with the plot area (inside the axes) drawn on: the reward line and
    // the eval points, each in its colour.
    let area = ((100, 900), (60, 440));
    let drawn = image.count(area.0, area.1, not_white);
    let blue = image.count(area.0, area.1, bluish);
    let red = image.count(area.0, area.1, reddish);
    assert!(drawn > 2000, "plot area nearly blank: {drawn} pixels drawn");
    assert!(blue > 500, "no reward line: {blue} blue pixels");
    assert!(red > 150, "no eval points: {red} red pixels");
    // Text (caption, tick labels, axis names) is drawn with the embedded
    // font: dark pixels left of the plot area (y labels), below it (x
    // labels) and above it (the caption).
    let dark = |p: [u8; 3]| p.iter().all(|&c| c < 128);
    let counts = [
        image.count((0, 70), (60, 440), dark),
        image.count((100, 900), (440, 500), dark),
        image.count((250, 750), (0, 40), dark),
    ];
    assert!(counts[0] > 200, "no y-axis text: {counts:?}");
    assert!(counts[1] > 150, "no x-axis text: {counts:?}");
    assert!(counts[2] > 600, "no caption: {counts:?}");
}

#[test]
fn eval_reward_is_accepted_and_a_plot_is_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let mut text = String::new();
    for step in 0..5 {
        text.push_str(&format!("{{\"step\":{step},\"reward\":{}}}\n", f64::from(step) * -0.5));
        if step % 2 == 0 {
            text.push_str(&format!(
                "{{\"step\":{step},\"reward\":null,\"eval_reward\":{}}}\n",
                f64::from(step) * 0.1
            ));
        }
    }
    text.push('\n'); // a blank line is fine
    std::fs::write(&metrics, text).unwrap();
    let png = dir.path().join("plot.png");
    std::fs::write(&png, b"an old plot").unwrap();
    plot_metrics(&metrics, &png).unwrap();
    let image = decode(&png);
    assert_eq!((image.width, image.height), PLOT_SIZE);
    assert!(
        image.count((100, 900), (60, 440), reddish) > 50,
        "no eval reward points"
    );
}

#[test]
fn a_single_step_plots() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    std::fs::write(&metrics, "{\"step\":0,\"reward\":0.5,\"eval_accuracy\":0.25}\n").unwrap();
    let png = dir.path().join("plot.png");
    plot_metrics(&metrics, &png).unwrap();
    assert_eq!((decode(&png).width, decode(&png).height), PLOT_SIZE);
}

fn error_of(text: &str) -> (String, Error) {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    std::fs::write(&metrics, text).unwrap();
    let png = dir.path().join("plot.png");
    let err = plot_metrics(&metrics, &png).unwrap_err();
    assert!(!png.exists(), "no plot from bad metrics");
    (metrics.display().to_string(), err)
}

#[test]
fn a_bad_line_errors_naming_the_file_and_line() {
    let good = "{\"step\":0,\"reward\":0.1}\n{\"step\":1,\"reward\":0.2}\n";
    for (bad, why) in [
        ("{\"step\":2,\"reward\":0.3", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ("{\"reward\":0.3}", "no `step`"),
        ("{\"step\":-1,\"reward\":0.3}", "`step`"),
        ("{\"step\":1.5,\"reward\":0.3}", "`step`"),
        ("{\"step\":2}", "no `reward`"),
        ("{\"step\":2,\"reward\":\"high\"}", "`reward`"),
        ("{\"step\":2,\"reward\":0.3,\"eval_accuracy\":true}", "`eval_accuracy`"),
    ] {
        let (file, err) = error_of(&format!("{good}{bad}\n{good}"));
        assert!(matches!(err, Error::Data { line: 3, .. }), "{bad}: {err}");
        let message = err.to_string();
        assert!(message.starts_with(&format!("{file}:3: ")), "{bad}: {message}");
        assert!(message.contains(why), "{bad}: {message}");
    }
}

#[test]
fn missing_or_empty_metrics_are_errors() {
    let (file, err) = error_of("\n\n");
    assert_eq!(err.to_string(), format!("{file}:0: no metrics"));

    let dir = tempfile::tempdir().unwrap();
    let err = plot_metrics(&dir.path().join("none.jsonl"), &dir.path().join("plot.png")).unwrap_err();
    assert!(matches!(err, Error::Data { line: 0, .. }), "{err}");
}
