//! `GET /metrics` over HTTP for a process with no HTTP server of its own:
//! `grpo worker` (beside its gRPC service) and `grpo run` (on a thread of
//! its own, [`Endpoint`]). Each scrape renders a [`Page`]; a page that
//! cannot be had (a worker whose engine stopped) is answered 503 with why.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// One scrape's page, or why there is none.
pub type Scrape = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// What each scrape renders.
pub type Page = Arc<dyn Fn() -> Scrape + Send + Sync>;

/// The page of `registry`, rendered afresh at each scrape.
pub fn registry_page(registry: Arc<prometheus_client::registry::Registry>) -> Page {
    Arc::new(move || {
        let page = crate::render(&[&registry]);
        Box::pin(async move { Ok(page) })
    })
}

async fn metrics(State(page): State<Page>) -> Response {
    match page().await {
        Ok(text) => ([(CONTENT_TYPE, crate::CONTENT_TYPE)], text).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

/// The router answering `GET /metrics` with `page`.
pub fn router(page: Page) -> Router {
    Router::new().route("/metrics", get(metrics)).with_state(page)
}

/// Serves `page` at `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    page: Page,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(page))
        .with_graceful_shutdown(shutdown)
        .await
}

/// `/metrics` served on a thread of its own until dropped.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Listens on `addr` (port 0 picks a free one) and serves `page`.
    pub fn start(addr: SocketAddr, page: Page) -> std::io::Result<Endpoint> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("metrics".to_string()).spawn(move || {
            let served = runtime.block_on(async move {
                let listener = TcpListener::from_std(listener)?;
                serve(listener, page, async move {
                    let _ = stopped.await;
                })
                .await
            });
            if let Err(error) = served {
                tracing::error!("the /metrics endpoint on {addr} stopped: {error}");
            }
        })?;
        Ok(Endpoint {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port picked, if 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
