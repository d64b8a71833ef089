//! LoRA adapters served by name, as vLLM's `--enable-lora` serves them: a
//! request whose `model` is an adapter's name is generated with that
//! adapter over the base model, in the same batches as every other
//! request; `/v1/models` lists each adapter with the base as its parent.
//!
//! Adapters come from PEFT folders: at start (`--lora-modules`) or at run
//! time (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`). Loading
//! reads the folder off the async threads, checks it against the model
//! and the engine's slots (rank, layers, free slot), and only then names
//! it; one load runs at a time.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::RwLock;

use grpo_model::lora::AdapterFolder;
use grpo_rollout::adapters::AdapterId;

use crate::error::{Error, Result};
use crate::routes::generate::unix_now;
use crate::state::AppState;

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
    /// Held while an adapter loads, so that two loads of one name cannot both succeed.
    loading: tokio::sync::Mutex<()>,
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, ServedAdapter>> {
        self.by_name.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, ServedAdapter>> {
        self.by_name.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Loads the PEFT adapter folder `path` as `name`: refused (400) when the
/// server serves no adapters, the name is empty, the base model's or
/// taken, or the folder does not fit the model or the engine's slots; a
/// 404 when there is no adapter folder at `path`.
pub async fn load(state: &AppState, name: &str, path: &str) -> Result<()> {
    check_enabled(state)?;
    if name.is_empty() || path.is_empty() {
        return Err(Error::InvalidRequest {
            message: "Both 'lora_name' and 'lora_path' must be provided.".to_string(),
            param: None,
        });
    }
    if name == state.model.name {
        return Err(Error::invalid(
            "lora_name",
            format!("'{name}' is the base model's name: give the adapter another"),
        ));
    }
    let adapters = &state.adapters;
    let _loading = adapters.loading.lock().await;
    if adapters.get(name).is_some() {
        return Err(Error::invalid(
            "lora_name",
            format!("The lora adapter '{name}' has already been loaded."),
        ));
    }
    if !Path::new(path).join(grpo_model::lora::ADAPTER_CONFIG_FILE).is_file() {
        return Err(Error::AdapterNotFound {
            message: format!("Loading lora {name} failed: No adapter found for {path}"),
        });
    }
    let (config, dir) = (state.model.config.clone(), path.to_string());
    let folder = tokio::task::spawn_blocking(move || AdapterFolder::read(Path::new(&dir), &config))
        .await
        .map_err(|e| Error::invalid("lora_path", format!("reading the adapter failed: {e}")))?
        .map_err(|e| Error::invalid("lora_path", format!("Loading lora {name} failed: {e}")))?;
    let tensors = folder.tensors.into_iter().collect();
    let id = state
        .backend
        .load_adapter(folder.lora, tensors)
        .await
        .map_err(|e| Error::invalid("lora_path", format!("Loading lora {name} failed: {e}")))?;
    let served = ServedAdapter {
        id,
        path: path.to_string(),
        created: unix_now(),
    };
    adapters.write().insert(name.to_string(), served);
    Ok(())
}

/// Unloads the adapter called `name`: its requests end as aborted. A 404
/// when no adapter has that name.
pub async fn unload(state: &AppState, name: &str) -> Result<()> {
    check_enabled(state)?;
    if name.is_empty() {
        return Err(Error::invalid(
            "lora_name",
            "'lora_name' needs to be provided to unload a LoRA adapter.",
        ));
    }
    let _loading = state.adapters.loading.lock().await;
    let served = state.adapters.get(name).ok_or_else(|| Error::AdapterNotFound {
        message: format!("The lora adapter '{name}' cannot be found."),
    })?;
    state.adapters.write().remove(name);
    state.backend.unload_adapter(served.id).await?;
    Ok(())
}

/// Refuses adapter loads on a server started without `--enable-lora`.
fn check_enabled(state: &AppState) -> Result<()> {
    if state.config.enable_lora {
        Ok(())
    } else {
        Err(Error::InvalidRequest {
            message: "LoRA is not enabled: start grpo serve with --enable-lora".to_string(),
            param: None,
        })
    }
}
