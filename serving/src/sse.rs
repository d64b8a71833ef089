//! Server-sent events in OpenAI's form: `data: {json}\n\n` per chunk, then
//! `data: [DONE]`. The body stream owns the generation: when the client
//! goes away the body is dropped, and with it the request's engine streams
//! (which aborts them).

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, stream};
use serde::Serialize;

/// The SSE response of `chunks`, closed by `[DONE]`.
pub fn respond<T: Serialize + Send + 'static>(chunks: impl Stream<Item = T> + Send + 'static) -> Response {
    let events = chunks
        .map(|chunk| Event::default().data(serde_json::to_string(&chunk).unwrap_or_default()))
        .chain(stream::once(async { Event::default().data("[DONE]") }))
        .map(Ok::<_, Infallible>);
    Sse::new(events).into_response()
}
