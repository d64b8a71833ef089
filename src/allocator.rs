//! The process's allocator: jemalloc, for the XLA plugin as well as Rust.
//!
//! XLA's CPU runtime takes the temporaries of every execution from
//! `malloc` (2.3 GB for SmolLM2-135M's train step on 16 × 96 tokens), and
//! the output buffers of every execution too. glibc serves blocks that
//! large with fresh `mmap`s and unmaps them on `free`, so each step
//! faulted its temporaries in again as zeroed pages. jemalloc, exported as
//! the process's `malloc` (see `build.rs`, so the dynamically loaded plugin
//! binds to it too), keeps freed pages and hands them back on the next
//! step. Two choices decide how much it keeps and how fast a step runs:
//!
//! - **One arena.** jemalloc's default is an arena per thread (4 per
//!   core); XLA allocates a program's temporaries and outputs on whichever
//!   thread runs it, so every arena came to hold its own freed copy of the
//!   train step's temporaries: the arithmetic example's peak resident
//!   memory over its first 6 steps was 7.7–8.3 GB where one arena holds
//!   5.4–5.5 GB. Small blocks still come from each thread's cache without
//!   a lock.
//! - **Nothing given back.** Freed pages stay with the process. Pages given
//!   back must be faulted in and zeroed when touched again, and a page
//!   new to the process can cost far more: on the virtual machines grpo is
//!   developed on, fresh memory was first touched at 0.19 GB/s (2.3–11.8
//!   GB/s on later tries) against 27 GB/s for a `memset` of touched
//!   pages. With jemalloc's time-based purging (a minute) part of the train
//!   step's temporaries was purged between steps and faulted in again, and train steps took up to 1.8× as long. What
//!   the process keeps is bounded by the largest footprint it reached.
//!
//! Transparent huge pages are left to the system's setting: jemalloc's
//! `thp:always` made the peak ~0.9 GB higher in some runs (a huge page stays
//! whole while partly used) and no step faster. `MALLOC_CONF` still
//! overrides any of these options.

/// jemalloc as Rust's allocator; with the `unprefixed` feature it also
/// defines the C allocation functions.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options (read at its first allocation): one
/// arena for every thread and size (no per-thread arenas, no separate arena
/// for large blocks), freed pages never purged.
#[unsafe(export_name = "malloc_conf")]
static MALLOC_CONF: &[u8; 67] = b"narenas:1,oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1\0";
