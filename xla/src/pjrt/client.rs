//! A PJRT client: the devices of one plugin, and the entry point for buffers
//! and compilation.

use std::ffi::CString;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::api::{Api, pjrt_call, string_from_raw};
use super::cache::{CompileCache, CompileStats};
use super::compile_options::CompileOptions;
use super::device::{Device, MemoryStats};
use super::executable::Executable;
use super::ffi;
use super::locate::{Platform, cache_dir};
use super::plugin::Plugin;
use crate::error::Result;

/// A value of a client create option.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// A string.
    Str(String),
    /// A 64-bit integer.
    Int(i64),
    /// A list of 64-bit integers.
    IntList(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

/// How to create a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Plugin-specific create options, passed as `PJRT_NamedValue`s.
    /// Default: none.
    pub create_options: Vec<(String, OptionValue)>,
    /// Folder of the on-disk compile cache; `None` keeps compiled programs
    /// in memory only. Default: `<grpo cache>/compiled`.
    pub compile_cache_dir: Option<PathBuf>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            create_options: Vec::new(),
            compile_cache_dir: Some(cache_dir().join("compiled")),
        }
    }
}

impl ClientOptions {
    /// Asks the CPU plugin for `count` virtual devices (`cpu_device_count`).
    pub fn cpu_device_count(mut self, count: usize) -> Self {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        self.create_options
            .push(("cpu_device_count".to_string(), OptionValue::Int(count)));
        self
    }

    /// Uses `dir` for the on-disk compile cache, or none.
    pub fn compile_cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.compile_cache_dir = dir;
        self
    }
}

/// Live device buffers created through a client, as grpo counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBuffers {
    /// Buffers not yet dropped.
    pub count: usize,
    /// Their device bytes.
    pub bytes: usize,
}

/// A PJRT client. Cheap to clone; clones share devices and the compile cache.
/// It is `Send + Sync`: threads and tasks may share it.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
    cache: Arc<CompileCache>,
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) raw: NonNull<ffi::Client>,
    platform_name: String,
    platform_version: String,
    pub(crate) devices: Vec<Device>,
    live_count: AtomicUsize,
    live_bytes: AtomicUsize,
}

// SAFETY: a PJRT client is thread-safe by the C API's contract (PjRtClient
// methods may be called concurrently); the rest is immutable or atomic.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform_name)
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

impl ClientInner {
    pub(crate) fn api(&self) -> Api {
        self.plugin.api()
    }

    /// Counts one more live buffer (of no bytes yet).
    pub(crate) fn track_buffer(&self) {
        self.live_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `bytes` to the live buffers' total.
    pub(crate) fn track_bytes(&self, bytes: usize) {
        self.live_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn untrack_buffer(&self, bytes: usize) {
        self.live_count.fetch_sub(1, Ordering::Relaxed);
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// The device with this raw handle, if it is one of the client's.
    pub(crate) fn device_by_raw(&self, raw: *mut ffi::Device) -> Option<&Device> {
        self.devices.iter().find(|d| d.raw() == raw)
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = ffi::ClientDestroyArgs::new();
        args.client = self.raw.as_ptr();
        if let Err(error) = pjrt_call!(self.api(), client_destroy, args) {
            tracing::warn!("destroying the PJRT client: {error}");
        }
    }
}

impl Client {
    /// A client of the plugin for `platform`, found as [`Plugin::find`] does.
    pub fn for_platform(platform: Platform, options: ClientOptions) -> Result<Client> {
        Client::new(&Plugin::find(platform)?, options)
    }

    /// Creates a client of `plugin`.
    pub fn new(plugin: &Plugin, options: ClientOptions) -> Result<Client> {
        let api = plugin.api();
        let named = NamedValues::new(&options.create_options);
        let mut args = ffi::ClientCreateArgs::new();
        args.create_options = named.values.as_ptr();
        args.num_options = named.values.len();
        pjrt_call!(api, client_create, args)?;
        let raw = NonNull::new(args.client)
            .ok_or_else(|| crate::Error::unexpected("client_create", "the plugin returned no client"))?;
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw,
            platform_name: String::new(),
            platform_version: String::new(),
            devices: Vec::new(),
            live_count: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
        };
        // From here on `inner` owns the client and destroys it on any error.
        inner.platform_name = platform_name(api, raw)?;
        inner.platform_version = platform_version(api, raw)?;
        inner.devices = Device::addressable(api, raw)?;
        let cache = CompileCache::new(options.compile_cache_dir, fingerprint(&inner).into_bytes());
        Ok(Client {
            inner: Arc::new(inner),
            cache: Arc::new(cache),
        })
    }

    /// The plugin this client runs on.
    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    /// The platform's name as the plugin reports it (`cpu`, `cuda`, `tpu`).
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    /// The platform's version as the plugin reports it.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// What identifies this client's code generation: the plugin file, its
    /// versions, the devices and `XLA_FLAGS`. Equal fingerprints compile
    /// equal programs alike (the compile cache keys on it; measurements
    /// cached per plugin do too).
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.inner)
    }

    /// The devices this process can use, in the plugin's order.
    pub fn devices(&self) -> &[Device] {
        &self.inner.devices
    }

    /// The addressable device at `index`.
    pub fn device(&self, index: usize) -> Result<&Device> {
        self.inner.devices.get(index).ok_or(crate::Error::NoSuchDevice {
            index,
            count: self.inner.devices.len(),
        })
    }

    /// Memory statistics of `device`, where the plugin reports them.
    pub fn memory_stats(&self, device: &Device) -> Result<MemoryStats> {
        device.memory_stats(self.inner.api())
    }

    /// Buffers created through this client and not yet dropped.
    pub fn live_buffers(&self) -> LiveBuffers {
        LiveBuffers {
            count: self.inner.live_count.load(Ordering::Relaxed),
            bytes: self.inner.live_bytes.load(Ordering::Relaxed),
        }
    }

    /// Compiles StableHLO text (`"mlir"` format), or returns the cached
    /// executable compiled from the same text, plugin and options.
    pub fn compile(&self, program: &str, options: &CompileOptions) -> Result<Executable> {
        options.validate(&self.inner.devices)?;
        self.cache.get_or_compile(self, program, options)
    }

    /// How many programs were compiled or found in the caches.
    pub fn compile_stats(&self) -> CompileStats {
        self.cache.stats()
    }
}

/// Owned `PJRT_NamedValue`s and the strings and lists they point to.
struct NamedValues {
    values: Vec<ffi::NamedValue>,
    _names: Vec<CString>,
    _strings: Vec<CString>,
    _lists: Vec<Vec<i64>>,
}

impl NamedValues {
    fn new(options: &[(String, OptionValue)]) -> NamedValues {
        let mut owned = NamedValues {
            values: Vec::new(),
            _names: Vec::new(),
            _strings: Vec::new(),
            _lists: Vec::new(),
        };
        for (name, value) in options {
            let name = CString::new(name.as_str()).unwrap_or_default();
            let mut named = ffi::NamedValue::new();
            named.name = name.as_ptr();
            named.name_size = name.as_bytes().len();
            named.value_size = 1;
            match value {
                OptionValue::Str(text) => {
                    let text = CString::new(text.as_str()).unwrap_or_default();
                    named.kind = ffi::NAMED_VALUE_STRING;
                    named.value.string_value = text.as_ptr();
                    named.value_size = text.as_bytes().len();
                    owned._strings.push(text);
                }
                OptionValue::Int(v) => {
                    named.kind = ffi::NAMED_VALUE_INT64;
                    named.value.int64_value = *v;
                }
                OptionValue::IntList(list) => {
                    let list = list.clone();
                    named.kind = ffi::NAMED_VALUE_INT64_LIST;
                    named.value.int64_array_value = list.as_ptr();
                    named.value_size = list.len();
                    owned._lists.push(list);
                }
                OptionValue::Float(v) => {
                    named.kind = ffi::NAMED_VALUE_FLOAT;
                    named.value.float_value = *v;
                }
                OptionValue::Bool(v) => {
                    named.kind = ffi::NAMED_VALUE_BOOL;
                    named.value.bool_value = *v;
                }
            }
            owned._names.push(name);
            owned.values.push(named);
        }
        owned
    }
}

fn platform_name(api: Api, client: NonNull<ffi::Client>) -> Result<String> {
    let mut args = ffi::ClientPlatformNameArgs::new();
    args.client = client.as_ptr();
    pjrt_call!(api, client_platform_name, args)?;
    // SAFETY: the name lives as long as the client.
    Ok(unsafe { string_from_raw(args.platform_name, args.platform_name_size) })
}

fn platform_version(api: Api, client: NonNull<ffi::Client>) -> Result<String> {
    let mut args = ffi::ClientPlatformVersionArgs::new();
    args.client = client.as_ptr();
    pjrt_call!(api, client_platform_version, args)?;
    // SAFETY: the version lives as long as the client.
    Ok(unsafe { string_from_raw(args.platform_version, args.platform_version_size) })
}

/// What, besides program and options, decides whether a compiled program
/// can be reused: the plugin file, its versions, the devices, and
/// `XLA_FLAGS` (which the plugin reads and which changes code generation).
fn fingerprint(client: &ClientInner) -> String {
    let path = client.plugin.path();
    let file = std::fs::metadata(path).ok();
    let modified = file
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let kinds: Vec<&str> = client.devices.iter().map(|d| d.kind()).collect();
    let xla_flags = std::env::var("XLA_FLAGS").unwrap_or_default();
    format!(
        "{}|{}|{}|{:?}|{}|{}|{}|{:?}|{xla_flags}",
        path.display(),
        file.map_or(0, |m| m.len()),
        modified,
        client.plugin.api_version(),
        client.platform_name,
        client.platform_version,
        client.devices.len(),
        kinds
    )
}
