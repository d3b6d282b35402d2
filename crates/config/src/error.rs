//! The one error type of this crate. Every variant names what the operator must look at: the file,
//! the key path, the value, the variable, and what was expected.

use std::path::PathBuf;

/// Everything that can go wrong while loading, validating or resolving the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The settings file named on the command line does not exist.
    #[error("configuration file {} does not exist", .path.display())]
    FileNotFound { path: PathBuf },

    /// The settings file exists but could not be read.
    #[error("cannot read configuration file {}: {source}", .path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The settings file's extension is neither `.json` nor `.toml`.
    #[error(
        "configuration file {} has {}; expected a .json or .toml file",
        .path.display(),
        match .extension { Some(e) => format!("extension .{e}"), None => "no extension".to_owned() }
    )]
    UnsupportedExtension {
        path: PathBuf,
        extension: Option<String>,
    },

    /// The settings file is not valid JSON / TOML.
    #[error("cannot parse {}: {message}", .path.display())]
    Parse { path: PathBuf, message: String },

    /// A key that no section knows.
    #[error("unknown key `{key}` in {origin}; expected one of {expected}")]
    UnknownKey {
        /// Full key path, e.g. `sglang.chat_ur`.
        key: String,
        /// The file path, or the environment variable / flag that set it.
        origin: String,
        /// The keys accepted at that place.
        expected: String,
    },

    /// A value of the wrong type or out of range, found while reading the layers.
    #[error("{key} = {value} in {origin}: expected {expected}")]
    BadValue {
        key: String,
        /// The value as written (JSON syntax).
        value: String,
        origin: String,
        expected: String,
    },

    /// The operators' name `taotoken` and the product's name `provider` used side by side.
    #[error(
        "both `provider` and `taotoken` sections are set in {origin}; they are the same section \
         (`taotoken` is the operators' name for `provider`): keep only one"
    )]
    DuplicateProviderSection { origin: String },

    /// A value that has the right type but is not acceptable (found by `validate()`).
    #[error(
        "{key} = {value}{}: {expected}",
        match .origin { Some(o) => format!(" (set in {o})"), None => String::new() }
    )]
    Invalid {
        key: String,
        /// The value (JSON syntax), or `<redacted>` when it may be a secret.
        value: String,
        /// What is expected, and how to fix it.
        expected: String,
        /// Where the value came from, when known (file path, variable, flag).
        origin: Option<String>,
    },

    /// A key names an environment variable that is not set.
    #[error("{key} names {var}, which is not set in the environment")]
    MissingSecret {
        /// The key that named the variable, e.g. `provider.api_key_env`.
        key: String,
        /// The variable's name.
        var: String,
    },

    /// A key names an environment variable that is set but empty.
    #[error("{key} names {var}, which is set but empty")]
    EmptySecret { key: String, var: String },

    /// Any other error reported by the layering library.
    #[error("configuration error: {0}")]
    Layering(String),

    /// Several problems, each on its own line.
    #[error(
        "{} configuration problems:\n{}",
        .0.len(),
        .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n")
    )]
    Many(Vec<ConfigError>),
}

impl ConfigError {
    /// The individual errors (one, or the members of [`ConfigError::Many`]).
    pub fn errors(&self) -> Vec<&ConfigError> {
        match self {
            Self::Many(all) => all.iter().collect(),
            other => vec![other],
        }
    }

    /// One error when there is one, [`ConfigError::Many`] when there are several.
    pub(crate) fn from_list(mut errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Self::Many(errors)),
        }
    }
}
