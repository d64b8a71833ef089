//! The interpreter of the tests' independent Python readers (included by
//! test files with `#[path]`): `$GRPO_TEST_PYTHON` (`scripts/test.sh` sets
//! it from `tools/test-venv.sh`), else what `tools/test-venv.sh` prints
//! after making the venv. Either way a test fails, never skips, when the
//! packages are missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The test venv's Python.
pub fn test_python() -> PathBuf {
    if let Some(python) = std::env::var_os("GRPO_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    // The workspace root is the package's folder or its parent.
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = [package, package.parent().unwrap_or(package)]
        .iter()
        .map(|dir| dir.join("tools/test-venv.sh"))
        .find(|script| script.is_file())
        .unwrap_or_else(|| panic!("no tools/test-venv.sh in or above {}", package.display()));
    let output = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed ({}): the test venv could not be installed",
        script.display(),
        output.status
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("test-venv.sh printed no interpreter")
            .trim(),
    )
}
