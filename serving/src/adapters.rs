//! LoRA adapters served by name, as vLLM's `--enable-lora` serves them: a
//! request whose `model` is an adapter's name is generated with that
//! adapter over the base model, in the same batches as every other
//! request; `/v1/models` lists each adapter with the base as its parent.
//!
//! This module holds the names; [`crate::routes::lora`] loads and unloads
//! adapters from PEFT folders, at start (`--lora-modules`) or at run time.

use std::collections::BTreeMap;
use std::sync::RwLock;

use grpo_rollout::adapters::AdapterId;

/// One adapter the server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedAdapter {
    /// Its id in the engine.
    pub id: AdapterId,
    /// The folder it was loaded from, as given.
    pub path: String,
    /// When it was loaded (Unix seconds).
    pub created: u64,
}

/// The adapters served, by name.
#[derive(Debug, Default)]
pub struct ServedAdapters {
    by_name: RwLock<BTreeMap<String, ServedAdapter>>,
    /// Held while an adapter loads or unloads, so that two loads of one
    /// name cannot both succeed.
    pub changing: tokio::sync::Mutex<()>,
}

impl ServedAdapters {
    /// The adapter called `name`.
    pub fn get(&self, name: &str) -> Option<ServedAdapter> {
        self.read().get(name).cloned()
    }

    /// Every adapter with its name, by name.
    pub fn list(&self) -> Vec<(String, ServedAdapter)> {
        self.read().iter().map(|(n, a)| (n.clone(), a.clone())).collect()
    }

    /// Serves `adapter` as `name`.
    pub fn insert(&self, name: &str, adapter: ServedAdapter) {
        self.write().insert(name.to_string(), adapter);
    }

    /// Stops serving the adapter called `name`; it, if there was one.
    pub fn remove(&self, name: &str) -> Option<ServedAdapter> {
        self.write().remove(name)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, ServedAdapter>> {
        self.by_name.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, ServedAdapter>> {
        self.by_name.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
