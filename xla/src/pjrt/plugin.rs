//! Loading a PJRT plugin library and checking that grpo can speak to it.
//!
//! A plugin is loaded and initialized once per process and never unloaded
//! (XLA's threads and static state do not survive `dlclose`, which is why JAX
//! keeps its plugins loaded too); loading the same file again returns the
//! same [`Plugin`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::api::{Api, pjrt_call, string_from_raw};
use super::ffi;
use super::locate::{Platform, PluginSearch};
use crate::error::{Error, Result};

/// A loaded, initialized PJRT plugin. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInfo>,
}

struct PluginInfo {
    path: PathBuf,
    api: Api,
    version: (i32, i32),
    attributes: Vec<(String, String)>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("version", &self.inner.version)
            .finish()
    }
}

impl Plugin {
    /// Finds the plugin for `platform` (see [`PluginSearch::from_environment`]) and loads it.
    pub fn find(platform: Platform) -> Result<Plugin> {
        let path = PluginSearch::from_environment(platform).find(platform)?;
        Plugin::load(path)
    }

    /// Loads the plugin library at `path`, checks its API version and initializes it.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        let path = path.as_ref();
        let key = path.canonicalize().map_err(|e| Error::PluginLoad {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        static LOADED: OnceLock<Mutex<HashMap<PathBuf, Plugin>>> = OnceLock::new();
        let mut loaded = LOADED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(plugin) = loaded.get(&key) {
            return Ok(plugin.clone());
        }
        let plugin = Plugin::load_new(&key)?;
        loaded.insert(key, plugin.clone());
        Ok(plugin)
    }

    fn load_new(path: &Path) -> Result<Plugin> {
        // SAFETY: loading a shared library runs its initializers; PJRT
        // plugins are built to be loaded this way.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| Error::PluginLoad {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        type GetApi = unsafe extern "C" fn() -> *const ffi::Api;
        // SAFETY: the symbol, if present, has this signature in every PJRT plugin.
        let get_api = unsafe { library.get::<GetApi>(b"GetPjrtApi\0") }.map_err(|_| Error::NotAPlugin {
            path: path.to_path_buf(),
        })?;
        // SAFETY: calling the plugin's entry point, which takes no arguments.
        let raw = unsafe { get_api() };
        // The version struct must be inside the table the plugin reports.
        let version_end = std::mem::offset_of!(ffi::Api, pjrt_api_version) + ffi::ApiVersion::STRUCT_SIZE;
        // SAFETY: a non-null table's first field is its size, checked before reading further.
        if raw.is_null() || unsafe { (*raw).struct_size } < version_end {
            return Err(Error::NotAPlugin {
                path: path.to_path_buf(),
            });
        }
        // The library stays loaded for the rest of the process (see module docs).
        std::mem::forget(library);
        // SAFETY: the table lives as long as the library, which is never unloaded.
        let api = unsafe { Api::from_raw(raw) };
        let version = (
            api.raw().pjrt_api_version.major_version,
            api.raw().pjrt_api_version.minor_version,
        );
        check_version(path, version)?;
        let mut init = ffi::PluginInitializeArgs::new();
        pjrt_call!(api, plugin_initialize, init)?;
        Ok(Plugin {
            inner: Arc::new(PluginInfo {
                path: path.to_path_buf(),
                api,
                version,
                attributes: read_attributes(api),
            }),
        })
    }

    /// The plugin file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The PJRT C API version the plugin implements, as (major, minor).
    pub fn api_version(&self) -> (i32, i32) {
        self.inner.version
    }

    /// The plugin's attributes (`xla_version`, `stablehlo_current_version`, …), as text.
    pub fn attributes(&self) -> &[(String, String)] {
        &self.inner.attributes
    }

    pub(crate) fn api(&self) -> Api {
        self.inner.api
    }
}

/// Refuses versions whose layouts may differ from the ones grpo declares.
fn check_version(path: &Path, (major, minor): (i32, i32)) -> Result<()> {
    let advice = if major != ffi::API_MAJOR {
        "its major version differs, so its structs are laid out differently; use a plugin of the 0.x series"
    } else if minor < ffi::API_MINOR {
        "the plugin is too old; install a newer one (see `grpo setup`)"
    } else {
        return Ok(());
    };
    Err(Error::ApiVersion {
        path: path.to_path_buf(),
        major,
        minor,
        need_major: ffi::API_MAJOR,
        need_minor: ffi::API_MINOR,
        advice,
    })
}

/// The plugin's attributes as (name, value) text, or none if it has no such call.
fn read_attributes(api: Api) -> Vec<(String, String)> {
    let mut args = ffi::PluginAttributesArgs::new();
    if pjrt_call!(api, plugin_attributes, args).is_err() || args.attributes.is_null() {
        return Vec::new();
    }
    // SAFETY: the plugin returned `num_attributes` values living for the process.
    let values = unsafe { std::slice::from_raw_parts(args.attributes, args.num_attributes) };
    values.iter().map(named_value_text).collect()
}

/// A named value as (name, value) text.
fn named_value_text(value: &ffi::NamedValue) -> (String, String) {
    // SAFETY: name and string/array values are (pointer, length) pairs owned
    // by the plugin; the union member read is the one `kind` names.
    unsafe {
        let name = string_from_raw(value.name, value.name_size);
        let text = match value.kind {
            ffi::NAMED_VALUE_STRING => string_from_raw(value.value.string_value, value.value_size),
            ffi::NAMED_VALUE_INT64 => value.value.int64_value.to_string(),
            ffi::NAMED_VALUE_INT64_LIST if !value.value.int64_array_value.is_null() => {
                let list = std::slice::from_raw_parts(value.value.int64_array_value, value.value_size);
                list.iter().map(i64::to_string).collect::<Vec<_>>().join(".")
            }
            ffi::NAMED_VALUE_FLOAT => value.value.float_value.to_string(),
            ffi::NAMED_VALUE_BOOL => value.value.bool_value.to_string(),
            _ => String::from("?"),
        };
        (name, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_checked() {
        let path = Path::new("plugin.so");
        assert!(check_version(path, (0, ffi::API_MINOR)).is_ok());
        assert!(check_version(path, (0, 115)).is_ok());
        let old = check_version(path, (0, 54)).unwrap_err().to_string();
        assert!(old.contains("too old") && old.contains("0.54"), "{old}");
        let major = check_version(path, (1, 0)).unwrap_err().to_string();
        assert!(major.contains("major"), "{major}");
    }
}
