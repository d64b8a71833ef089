//! The process's allocator: jemalloc, for the XLA plugin as well as Rust.
//!
//! XLA's CPU runtime takes the temporaries of every execution from
//! `malloc` (2.3 GB for SmolLM2-135M's train step on 16 × 96 tokens).
//! glibc serves blocks that large with fresh `mmap`s and unmaps them on
//! `free`, so each step faulted in ~770k zeroed pages again, about a
//! quarter of the step. jemalloc, exported as the process's `malloc` (see
//! `build.rs`, so the dynamically loaded plugin binds to it too) and told
//! to keep freed pages for a minute, hands the same pages back on the next
//! step: the bf16 train step went 4.05 → 3.10 s. What it keeps is bounded
//! by the largest step's peak; `MALLOC_CONF` still overrides these options.

/// jemalloc as Rust's allocator; with the `unprefixed` feature it also
/// defines the C allocation functions.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options (read at its first allocation): one
/// arena policy for all sizes (no separate eagerly purged arena for large
/// blocks), freed pages reused for 60 s before they go back to the system,
/// transparent huge pages for its memory (fewer faults when it grows).
#[unsafe(export_name = "malloc_conf")]
static MALLOC_CONF: &[u8; 74] = b"oversize_threshold:0,dirty_decay_ms:60000,muzzy_decay_ms:60000,thp:always\0";
