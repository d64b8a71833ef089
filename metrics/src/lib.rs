//! Prometheus exposition shared by `grpo serve`, `grpo worker` and `grpo
//! run`, on the `prometheus-client` crate: registries rendered as one page in
//! Prometheus' text format, version 0.0.4 ([`render`]). The crate escapes
//! label values (`\`, `"` and line breaks) and adds `_total` to counters.
//! [`engine`] holds the engine's gauges, which are read at scrape time.
//! [`endpoint`] serves `GET /metrics` for a process that has no HTTP server
//! of its own.

pub mod endpoint;
pub mod engine;

pub use prometheus_client;
use prometheus_client::registry::Registry;

/// The `Content-Type` of a page.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// `registries` as one page, in order.
pub fn render(registries: &[&Registry]) -> String {
    let mut page = String::new();
    for registry in registries {
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut page, registry);
    }
    page
}

/// A registry whose every metric carries the label `name="value"`.
pub fn labelled(name: &'static str, value: &str) -> Registry {
    Registry::with_labels(std::iter::once((name.into(), value.to_string().into())))
}
