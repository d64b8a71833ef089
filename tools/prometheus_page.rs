//! A Prometheus page read with the official Python parser (included by test
//! files with `#[path]`, beside `test_python.rs`): `tools/prometheus_page.py`
//! under the test venv's Python.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// One sample of a page.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Sample {
    /// The family's name (a counter's without `_total`).
    pub family: String,
    /// The family's type: `counter`, `gauge`, `histogram`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The sample's name (`_total`, `_bucket`, `_sum`, … included).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value (`+Inf`, `-Inf` and `NaN` as strings).
    pub value: serde_json::Value,
}

impl Sample {
    /// The value as a number.
    pub fn number(&self) -> f64 {
        self.value
            .as_f64()
            .unwrap_or_else(|| panic!("{} is {}", self.name, self.value))
    }
}

/// `GET http://{addr}/metrics`'s page, or `None` while nothing answers
/// there (an answer other than 200 fails the test).
pub fn fetch(addr: &str) -> Option<String> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    Some(body.to_string())
}

/// The samples of `page`, which the parser must accept.
pub fn parse_page(python: &Path, page: &str) -> Vec<Sample> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = [root, root.parent().unwrap_or(root)]
        .iter()
        .map(|dir| dir.join("tools/prometheus_page.py"))
        .find(|script| script.is_file())
        .expect("tools/prometheus_page.py");
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    child.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "prometheus_client refused the page:\n{}\n--- page\n{page}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The value of the sample `name` whose labels include `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .unwrap_or_else(|| panic!("no {name} {labels:?} among {samples:#?}"))
        .number()
}
