//! The compile cache: in memory by key, and on disk through the plugin's
//! executable serialization.
//!
//! A key is the SHA-256 of the program text, the serialized compile options
//! and a salt naming the plugin (file, size, mtime, versions), the devices and
//! `XLA_FLAGS`, so
//! an entry is only ever loaded by the plugin that wrote it. Disk entries are
//! written to a temporary file and renamed, so a crash leaves no torn entry;
//! an entry the plugin cannot load is compiled again and replaced.
//!
//! Memory: one executable per distinct (program, options) — programs are
//! bucketed by shape, so this stays small; nothing is evicted.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::client::Client;
use super::compile_options::CompileOptions;
use super::executable::Executable;
use crate::error::{Error, Result};

/// Counts of compile requests by how they were served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Programs compiled by the plugin.
    pub compiles: u64,
    /// Requests served from memory.
    pub memory_hits: u64,
    /// Requests served by loading a serialized executable from disk.
    pub disk_hits: u64,
}

pub(crate) struct CompileCache {
    dir: Option<PathBuf>,
    salt: Vec<u8>,
    state: Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    executables: HashMap<String, Executable>,
    stats: CompileStats,
}

impl CompileCache {
    pub(crate) fn new(dir: Option<PathBuf>, salt: Vec<u8>) -> CompileCache {
        CompileCache {
            dir,
            salt,
            state: Mutex::new(CacheState::default()),
        }
    }

    pub(crate) fn stats(&self) -> CompileStats {
        self.lock().stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The executable for (program, options): from memory, from disk, or compiled.
    ///
    /// The lock is not held while compiling, so threads compiling different
    /// programs do not wait on each other.
    pub(crate) fn get_or_compile(
        &self,
        client: &Client,
        program: &str,
        options: &CompileOptions,
    ) -> Result<Executable> {
        let options = options.to_proto_bytes();
        let key = self.key(program, &options);
        {
            let mut state = self.lock();
            if let Some(executable) = state.executables.get(&key).cloned() {
                state.stats.memory_hits += 1;
                return Ok(executable);
            }
        }
        let from_disk = self.load(client, &key, program);
        let executable = match from_disk {
            Some(executable) => {
                self.lock().stats.disk_hits += 1;
                executable
            }
            None => {
                let executable = Executable::compile_uncached(client, program, &options)?;
                self.lock().stats.compiles += 1;
                self.store(&key, &executable);
                executable
            }
        };
        let mut state = self.lock();
        Ok(state.executables.entry(key).or_insert(executable).clone())
    }

    fn key(&self, program: &str, options: &[u8]) -> String {
        let mut hasher = Sha256::new();
        for part in [
            b"grpo-compile-cache-v1".as_slice(),
            &self.salt,
            options,
            program.as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn entry_path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(format!("{key}.pjrt")))
    }

    fn load(&self, client: &Client, key: &str, program: &str) -> Option<Executable> {
        let path = self.entry_path(key)?;
        let bytes = std::fs::read(&path).ok()?;
        match Executable::deserialize(client, &bytes, program) {
            Ok(executable) => Some(executable),
            Err(error) => {
                tracing::warn!(
                    "compile cache entry {} does not load ({error}); compiling again",
                    path.display()
                );
                None
            }
        }
    }

    /// Writes the serialized executable; a plugin without serialization or a
    /// full disk only costs a recompile next time, so failures are logged.
    fn store(&self, key: &str, executable: &Executable) {
        let Some(path) = self.entry_path(key) else {
            return;
        };
        let bytes = match executable.serialize() {
            Ok(bytes) if !bytes.is_empty() => bytes,
            Ok(_) => return,
            Err(error) => {
                tracing::debug!("the plugin does not serialize executables: {error}");
                return;
            }
        };
        if let Err(error) = write_atomically(&path, &bytes) {
            tracing::warn!("cannot write the compile cache: {error}");
        }
    }
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let temporary = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    let mut file = std::fs::File::create(&temporary).map_err(|e| Error::io("create", &temporary, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io("write", &temporary, e))?;
    std::fs::rename(&temporary, path).map_err(|e| Error::io("rename into", path, e))
}
