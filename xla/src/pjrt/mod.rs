//! The PJRT runtime: plugins, clients, devices, buffers, executables and the
//! compile cache, over hand-declared C API layouts ([`ffi`]).

pub(crate) mod api;
mod buffer;
mod cache;
mod client;
mod compile_options;
mod device;
mod executable;
pub(crate) mod ffi;
mod locate;
mod plugin;
mod sharded;
mod signature;

pub use buffer::Buffer;
pub use cache::CompileStats;
pub use client::{Client, ClientOptions, LiveBuffers, OptionValue};
pub use compile_options::CompileOptions;
pub use device::{Device, MemoryStats};
pub use executable::{Arg, Executable, ProgramMemory};
pub use locate::{
    CACHE_DIR_ENV, PLUGIN_ENV, Platform, PluginSearch, cache_dir, install_once, install_plugin, pip_install_into,
    plugin_install_dir,
};
pub use plugin::Plugin;
pub use sharded::ShardedBuffer;
pub use signature::{Parameter, Signature};
