//! Shared helpers of the model tests.

use grpo_xla::{Client, ClientOptions, Platform};

/// A one-device client of the installed CPU plugin, without a disk cache.
/// Panics with the plugin search's advice (`grpo setup`) when there is none.
pub fn cpu_client() -> Client {
    Client::for_platform(
        Platform::Cpu,
        ClientOptions::default().compile_cache_dir(None).cpu_device_count(1),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}
