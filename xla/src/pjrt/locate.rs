//! Where PJRT plugins live: platforms, their pip packages, search and install.
//!
//! A plugin is looked for, in order: the file named by `GRPO_PJRT_PLUGIN`;
//! grpo's own cache folder (`<cache>/plugins/<platform>`, filled by
//! `grpo setup`); every entry of the Python `sys.path` of `python3`.
//! The cache folder is `GRPO_CACHE_DIR`, else `$XDG_CACHE_HOME/grpo`, else
//! `~/.cache/grpo`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Environment variable naming a plugin file to use instead of searching.
pub const PLUGIN_ENV: &str = "GRPO_PJRT_PLUGIN";
/// Environment variable naming grpo's cache folder.
pub const CACHE_DIR_ENV: &str = "GRPO_CACHE_DIR";

/// A kind of device a PJRT plugin drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// The host CPU.
    Cpu,
    /// NVIDIA GPUs.
    Cuda,
    /// Google TPUs.
    Tpu,
}

impl Platform {
    /// Every platform.
    pub const ALL: [Platform; 3] = [Platform::Cpu, Platform::Cuda, Platform::Tpu];

    /// The pip requirement that provides this platform's plugin.
    pub fn pip_requirement(self) -> &'static str {
        match self {
            Platform::Cpu => "lammps-jax-pjrt-cpu==0.11.2",
            Platform::Cuda => "jax-cuda13-pjrt",
            Platform::Tpu => "libtpu",
        }
    }

    /// Whether pip must skip the package's dependencies (the CPU package
    /// declares jax, which grpo does not need; CUDA needs its NVIDIA libraries).
    fn pip_no_deps(self) -> bool {
        matches!(self, Platform::Cpu | Platform::Tpu)
    }

    /// Plugin files of known packages, relative to a `site-packages` folder.
    pub fn plugin_files(self) -> &'static [&'static str] {
        match self {
            Platform::Cpu => &[
                "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
                "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
            ],
            Platform::Cuda => &[
                "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
                "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            ],
            Platform::Tpu => &["libtpu/libtpu.so"],
        }
    }

    /// Lower-case name (`cpu`, `cuda`, `tpu`).
    pub fn name(self) -> &'static str {
        match self {
            Platform::Cpu => "cpu",
            Platform::Cuda => "cuda",
            Platform::Tpu => "tpu",
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Platform {
    type Err = Error;

    fn from_str(name: &str) -> Result<Platform> {
        Platform::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::UnknownPlatform(name.to_string()))
    }
}

/// grpo's cache folder: plugins, compiled programs.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("grpo");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("grpo")
}

/// The folder `grpo setup` installs a platform's plugin package into.
pub fn plugin_install_dir(platform: Platform) -> PathBuf {
    cache_dir().join("plugins").join(platform.name())
}

/// The places a plugin is looked for, in order.
#[derive(Debug, Clone, Default)]
pub struct PluginSearch {
    /// A plugin file that wins over any search (`GRPO_PJRT_PLUGIN`).
    pub explicit: Option<PathBuf>,
    /// Folders holding Python packages, searched for known plugin files.
    pub package_dirs: Vec<PathBuf>,
}

impl PluginSearch {
    /// The search for `platform` on this machine: the environment variable,
    /// grpo's cache folder, then `python3`'s `sys.path`.
    pub fn from_environment(platform: Platform) -> PluginSearch {
        let mut package_dirs = vec![plugin_install_dir(platform)];
        package_dirs.extend(python_sys_path().iter().cloned());
        PluginSearch {
            explicit: std::env::var_os(PLUGIN_ENV).map(PathBuf::from),
            package_dirs,
        }
    }

    /// The first plugin file for `platform`, or an error saying how to get one.
    pub fn find(&self, platform: Platform) -> Result<PathBuf> {
        if let Some(path) = &self.explicit {
            return if path.is_file() {
                Ok(path.clone())
            } else {
                Err(Error::PluginNotFound {
                    platform: platform.to_string(),
                    searched: format!("{PLUGIN_ENV}={}", path.display()),
                    advice: format!("{PLUGIN_ENV} names no file; unset it or point it at a plugin .so"),
                })
            };
        }
        let found = self
            .package_dirs
            .iter()
            .flat_map(|dir| platform.plugin_files().iter().map(move |file| dir.join(file)))
            .find(|path| path.is_file());
        found.ok_or_else(|| Error::PluginNotFound {
            platform: platform.to_string(),
            searched: self
                .package_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            advice: install_advice(platform),
        })
    }
}

/// What a user runs to get the plugin for `platform`.
fn install_advice(platform: Platform) -> String {
    let setup = match platform {
        Platform::Cpu => "grpo setup".to_string(),
        other => format!("grpo setup --platform {other}"),
    };
    format!(
        "run `{setup}` (it pip-installs `{}` into {}), install that pip package yourself, or set {PLUGIN_ENV} to the plugin file",
        platform.pip_requirement(),
        plugin_install_dir(platform).display()
    )
}

/// `sys.path` of `python3`, asked once per process; empty without Python.
fn python_sys_path() -> &'static [PathBuf] {
    static PATHS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let output = Command::new("python3")
            .args(["-c", "import sys; print('\\n'.join(p for p in sys.path if p))"])
            .output();
        match output {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from)
                .filter(|p| p.is_dir())
                .collect(),
            _ => Vec::new(),
        }
    })
}

/// Installs the plugin package for `platform` into grpo's cache folder with
/// pip, unless a plugin file is already there; returns the plugin file.
/// Safe to run from several processes at once (see [`install_once`]).
pub fn install_plugin(platform: Platform) -> Result<PathBuf> {
    let dir = plugin_install_dir(platform);
    let only_cache = PluginSearch {
        explicit: None,
        package_dirs: vec![dir.clone()],
    };
    let installed = || only_cache.find(platform).ok();
    let install = || pip_install_into(platform.pip_requirement(), &dir, platform.pip_no_deps());
    install_once(&dir, installed, install).map_err(|failure| Error::PluginNotFound {
        platform: platform.to_string(),
        searched: dir.display().to_string(),
        advice: failure,
    })
}

/// What `installed` finds, installing `dir` with `install` first when it
/// finds nothing. Concurrent callers (two `grpo setup`s, tests starting
/// `grpo` in parallel on an empty cache folder) take turns on a lock file
/// beside `dir` (`.<name>.lock`), and a caller that waited finds what the
/// other installed instead of installing again. On failure, returns what
/// to check.
pub fn install_once<T>(
    dir: &Path,
    installed: impl Fn() -> Option<T>,
    install: impl FnOnce() -> std::result::Result<(), String>,
) -> std::result::Result<T, String> {
    if let Some(found) = installed() {
        return Ok(found);
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("package");
    std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let lock_path = parent.join(format!(".{name}.lock"));
    let lock = std::fs::File::create(&lock_path).map_err(|e| format!("cannot create {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    if let Some(found) = installed() {
        return Ok(found);
    }
    install()?;
    installed().ok_or_else(|| format!("installed into {}, but found nothing usable there", dir.display()))
}

/// `python3 -m pip install --target dir requirement` (with `--no-deps` if
/// asked), into a staging folder renamed over `dir` at the end, so an
/// interrupted install leaves nothing half-written. Run it inside
/// [`install_once`], which keeps other processes out. On failure, returns
/// what to check.
pub fn pip_install_into(requirement: &str, dir: &Path, no_deps: bool) -> std::result::Result<(), String> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("package");
    let staging = parent.join(format!(".{name}-installing"));
    let io = |action: &str, path: &Path, e: std::io::Error| format!("cannot {action} {}: {e}", path.display());
    std::fs::create_dir_all(parent).map_err(|e| io("create", parent, e))?;
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io("remove", &staging, e))?;
    }
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--root-user-action=ignore",
        "--target",
    ])
    .arg(&staging);
    if no_deps {
        pip.arg("--no-deps");
    }
    pip.arg(requirement);
    let status = pip.status().map_err(|e| io("run python3 -m pip for", &staging, e))?;
    if !status.success() {
        return Err(format!(
            "`python3 -m pip install --target {} {requirement}` failed ({status}); check that python3 and pip work and PyPI is reachable",
            staging.display()
        ));
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| io("remove", dir, e))?;
    }
    std::fs::rename(&staging, dir).map_err(|e| io("move into place", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_names_parse() {
        for platform in Platform::ALL {
            assert_eq!(platform.name().parse::<Platform>().unwrap(), platform);
        }
        assert_eq!("CUDA".parse::<Platform>().unwrap(), Platform::Cuda);
        assert!(matches!("gpu".parse::<Platform>(), Err(Error::UnknownPlatform(_))));
    }
}
