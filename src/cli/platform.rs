//! Choosing the device at run time: `--platform` or `--plugin`, shared by
//! every subcommand that runs programs.

use std::path::PathBuf;

use anyhow::Context;
use grpo_xla::{Client, ClientOptions, Error, Platform, Plugin, pjrt::install_plugin};

/// Which PJRT plugin to run on.
#[derive(Debug, Clone, clap::Args)]
pub struct PlatformArgs {
    /// Platform whose plugin is searched for: cpu, cuda or tpu.
    #[arg(long, default_value = "cpu", value_parser = parse_platform)]
    pub platform: Platform,
    /// A plugin file to load instead of searching (overrides --platform).
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Virtual devices the CPU plugin splits the host into.
    #[arg(long, default_value_t = 1)]
    pub cpu_devices: usize,
}

fn parse_platform(name: &str) -> Result<Platform, String> {
    name.parse().map_err(|e: Error| e.to_string())
}

impl PlatformArgs {
    /// Loads the chosen plugin. A missing CPU plugin is installed on the
    /// spot (as `grpo setup` would), saying so; others report what to run.
    pub fn plugin(&self) -> anyhow::Result<Plugin> {
        if let Some(path) = &self.plugin {
            return Plugin::load(path).with_context(|| format!("loading --plugin {}", path.display()));
        }
        match Plugin::find(self.platform) {
            Err(Error::PluginNotFound { .. }) if self.platform == Platform::Cpu => {
                eprintln!(
                    "no CPU plugin found: running `grpo setup` to install {} …",
                    Platform::Cpu.pip_requirement()
                );
                let path = install_plugin(Platform::Cpu)?;
                Ok(Plugin::load(path)?)
            }
            other => Ok(other?),
        }
    }

    /// A client of the chosen plugin; on CPU with `--cpu-devices` devices.
    pub fn client(&self) -> anyhow::Result<Client> {
        let plugin = self.plugin()?;
        let mut options = ClientOptions::default();
        if self.plugin.is_none() && self.platform == Platform::Cpu {
            options = options.cpu_device_count(self.cpu_devices);
        }
        Ok(Client::new(&plugin, options)?)
    }
}
