//! Work that would hold up the async threads — tokenizing, rendering a
//! chat template, parsing a large body — run on tokio's blocking threads,
//! so that other requests and `/health` go on meanwhile.

use crate::error::{Error, Result};

/// `work` on a blocking thread.
pub async fn off_thread<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Serve(std::io::Error::other(e)))?
}
