//! `grpo serve`'s LoRA flags, as vLLM names them: `--enable-lora`,
//! `--lora-modules name=path …` (or vLLM's JSON form), `--max-loras`,
//! `--max-lora-rank`, and run-time loading through
//! `--allow-runtime-lora-updating` or `VLLM_ALLOW_RUNTIME_LORA_UPDATING`.

use anyhow::{Context, bail};

/// The LoRA flags of `grpo serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoraServeArgs {
    /// Serve LoRA adapters by name: a request whose `model` is an
    /// adapter's name is generated with it, in the same batches as others.
    #[arg(long)]
    enable_lora: bool,
    /// Adapters to serve from the start: `name=path` (a PEFT folder) or
    /// JSON `{"name": …, "path": …, "base_model_name": …}`, space-separated.
    #[arg(long, num_args = 1.., value_name = "NAME=PATH")]
    lora_modules: Vec<String>,
    /// Adapters the engine holds at once (all of them on the device, any
    /// mix in one batch); default: the number of --lora-modules, at least 1.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    max_loras: Option<usize>,
    /// The highest adapter rank the engine takes.
    #[arg(long, default_value_t = 16, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    max_lora_rank: usize,
    /// Let /v1/load_lora_adapter and /v1/unload_lora_adapter change the
    /// adapters while serving (also on with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true).
    #[arg(long)]
    allow_runtime_lora_updating: bool,
}

/// One `--lora-modules` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    /// The name requests use.
    pub name: String,
    /// The PEFT folder.
    pub path: String,
}

/// What the LoRA flags ask of the engine and the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraServing {
    /// Adapter slots (0: adapters are off).
    pub max_loras: usize,
    /// Their rank.
    pub max_lora_rank: usize,
    /// Adapters to load before serving.
    pub modules: Vec<LoraModule>,
    /// Whether the run-time routes answer.
    pub runtime_updating: bool,
}

impl LoraServeArgs {
    /// The settings, checked: LoRA flags need --enable-lora, and a JSON
    /// entry's `base_model_name` must be `served` (the served model's name).
    pub fn settings(&self, served: &str) -> anyhow::Result<LoraServing> {
        let runtime_env = std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"));
        if !self.enable_lora {
            if !self.lora_modules.is_empty() || self.max_loras.is_some() || self.allow_runtime_lora_updating {
                bail!("--lora-modules, --max-loras and --allow-runtime-lora-updating need --enable-lora");
            }
            return Ok(LoraServing {
                max_loras: 0,
                max_lora_rank: self.max_lora_rank,
                modules: Vec::new(),
                runtime_updating: false,
            });
        }
        let modules = self
            .lora_modules
            .iter()
            .map(|entry| parse_module(entry, served))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let max_loras = self.max_loras.unwrap_or(modules.len().max(1));
        if modules.len() > max_loras {
            bail!(
                "--lora-modules names {} adapters but --max-loras is {max_loras}: every served adapter is held at once",
                modules.len()
            );
        }
        Ok(LoraServing {
            max_loras,
            max_lora_rank: self.max_lora_rank,
            modules,
            runtime_updating: self.allow_runtime_lora_updating || runtime_env,
        })
    }
}

/// One `--lora-modules` entry: `name=path`, or vLLM's JSON object.
fn parse_module(entry: &str, served: &str) -> anyhow::Result<LoraModule> {
    if entry.contains('=') && !entry.trim_start().starts_with('{') {
        let (name, path) = entry.split_once('=').expect("checked");
        if name.is_empty() || path.is_empty() {
            bail!("--lora-modules {entry}: give name=path");
        }
        return Ok(LoraModule {
            name: name.to_string(),
            path: path.to_string(),
        });
    }
    let usage =
        || format!("--lora-modules {entry}: give name=path or {{\"name\": …, \"path\": …, \"base_model_name\": …}}");
    let json: serde_json::Value = serde_json::from_str(entry).with_context(usage)?;
    let object = json.as_object().with_context(usage)?;
    if let Some(other) = object
        .keys()
        .find(|k| !["name", "path", "base_model_name"].contains(&k.as_str()))
    {
        bail!("--lora-modules {entry}: unknown field `{other}` (fields: name, path, base_model_name)");
    }
    let text = |key: &str| {
        object
            .get(key)
            .and_then(serde_json::Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let (Some(name), Some(path)) = (text("name"), text("path")) else {
        bail!("{}", usage());
    };
    if let Some(base) = text("base_model_name").filter(|b| *b != served) {
        bail!("--lora-modules {entry}: base_model_name `{base}` is not the served model `{served}`");
    }
    Ok(LoraModule {
        name: name.to_string(),
        path: path.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_in_both_forms() {
        let module = |name: &str, path: &str| LoraModule {
            name: name.to_string(),
            path: path.to_string(),
        };
        assert_eq!(parse_module("sql=/a/b", "m").unwrap(), module("sql", "/a/b"));
        let json = r#"{"name": "sql", "path": "/a=b", "base_model_name": "m"}"#;
        assert_eq!(parse_module(json, "m").unwrap(), module("sql", "/a=b"));
        for bad in [
            "=/a",
            "sql=",
            "sql",
            r#"{"name": "x", "path": "p", "base_model_name": "other"}"#,
        ] {
            assert!(parse_module(bad, "m").is_err(), "{bad}");
        }
    }
}
