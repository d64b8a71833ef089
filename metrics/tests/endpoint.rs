//! The `/metrics` endpoint: a registry's page with escaped labels, 503 with
//! the reason when a page cannot be had, and the port let go once dropped.

use std::sync::Arc;

use grpo_metrics::endpoint::{Endpoint, Page, registry_page};
use grpo_metrics::labelled;
use grpo_metrics::prometheus_client::metrics::counter::Counter;

#[tokio::test]
async fn an_endpoint_serves_its_page_with_escaped_labels_until_dropped() {
    let mut registry = labelled("model_name", "a\"b\\c\nd");
    let counter: Counter = Counter::default();
    registry.register("grpo_things", "Things counted", counter.clone());
    counter.inc_by(3);
    let endpoint = Endpoint::start("127.0.0.1:0".parse().unwrap(), registry_page(Arc::new(registry))).unwrap();
    let url = format!("http://{}/metrics", endpoint.addr());
    let answer = reqwest::get(&url).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let page = answer.text().await.unwrap();
    assert_eq!(
        page,
        "# HELP grpo_things_total Things counted.\n# TYPE grpo_things_total counter\n\
         grpo_things_total{model_name=\"a\\\"b\\\\c\\nd\"} 3\n"
    );
    counter.inc();
    assert!(
        reqwest::get(&url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .contains("} 4\n")
    );
    let addr = endpoint.addr();
    drop(endpoint);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "{addr} still answers"
    );
}

#[tokio::test]
async fn a_page_that_cannot_be_had_is_a_503_saying_why() {
    let page: Page = Arc::new(|| Box::pin(async { Err("the engine stopped".to_string()) }));
    let endpoint = Endpoint::start("127.0.0.1:0".parse().unwrap(), page).unwrap();
    let answer = reqwest::get(format!("http://{}/metrics", endpoint.addr()))
        .await
        .unwrap();
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.text().await.unwrap(), "the engine stopped");
}
