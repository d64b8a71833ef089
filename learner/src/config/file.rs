//! Reading a config file: TOML text → `--set` overrides → the typed
//! sections (an unknown, mistyped or out-of-set key refused naming its
//! path) → one validation of every value and cross-key rule → relative
//! paths taken from the file's folder.

use std::path::Path;

use crate::error::{Error, Result};

/// The error of a bad value of `field`.
fn invalid(field: &'static str, message: String) -> Error {
    Error::Config { field, message }
}

/// The error of a config that is not TOML.
fn not_toml(e: toml::de::Error) -> Error {
    invalid("config", format!("not TOML: {e}"))
}

/// A config's sections from its TOML `table`, an unknown or mistyped key
/// refused naming its path.
fn parse_sections<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let key = e.path().to_string();
        let message = e.into_inner().message().to_string();
        invalid("config", format!("`{key}`: {message}"))
    })
}

/// Applies `section.key=value` overrides (TOML values; anything else a
/// string) to the config text `text`, before it is validated.
pub fn with_overrides(text: &str, overrides: &[String]) -> Result<String> {
    let mut table: toml::Table = text.parse().map_err(not_toml)?;
    for item in overrides {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| invalid("--set", format!("`{item}` is not section.key=value")))?;
        let (section, field) = key
            .split_once('.')
            .ok_or_else(|| invalid("--set", format!("`{key}` is not section.key")))?;
        let parsed: toml::Value = format!("v = {value}")
            .parse::<toml::Table>()
            .map(|mut t| t.remove("v").expect("parsed one key"))
            .unwrap_or_else(|_| toml::Value::String(value.to_string()));
        let entry = table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(section_table) = entry else {
            return Err(invalid("--set", format!("`{section}` is not a section")));
        };
        section_table.insert(field.to_string(), parsed);
    }
    toml::to_string(&table).map_err(|e| invalid("--set", e.to_string()))
}

/// A run config in a TOML file: its sections parsed (unknown keys
/// refused naming them), checked, and its relative paths taken from the
/// file's folder.
pub trait ConfigFile: Sized + serde::de::DeserializeOwned {
    /// Top-level tables another parser reads (`grpo run`'s reward tables).
    const FOREIGN_TABLES: &[&str] = &[];

    /// Checks every value and their combinations.
    fn validate(&self) -> Result<()>;

    /// Makes the data and output paths relative to `base`.
    fn rebase(&mut self, base: &Path);

    /// Parses TOML text and validates it.
    fn from_toml_str(text: &str) -> Result<Self> {
        let mut table: toml::Table = text.parse().map_err(not_toml)?;
        for name in Self::FOREIGN_TABLES {
            table.remove(*name);
        }
        let config: Self = parse_sections(table)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML text of a config file in folder `base` (relative data
    /// and output paths are taken from there) and validates it.
    fn from_toml_at(text: &str, base: &Path) -> Result<Self> {
        let mut config = Self::from_toml_str(text)?;
        config.rebase(base);
        Ok(config)
    }

    /// Reads `path`; data and output paths become relative to its folder.
    fn from_file(path: &Path) -> Result<Self> {
        Self::from_toml_at(&read_text(path)?, path.parent().unwrap_or(Path::new(".")))
    }
}

/// The text of the config file `path`.
fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::Data {
        path: path.to_path_buf(),
        line: 0,
        message: format!("cannot read: {e}"),
    })
}
