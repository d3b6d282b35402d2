//! The one error type of this crate.

use std::path::PathBuf;
use std::sync::Arc;

/// Why a store operation failed. Every variant names the store file or the sequence number it is
/// about; the underlying error is kept as the `source`, not repeated in the message.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A configuration value is unusable.
    #[error("invalid sample store config: {field} = {value}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    /// The store directory could not be created.
    #[error("cannot create the sample store directory {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The database file could not be opened (already open elsewhere, corrupted, not a database,
    /// permissions, ...).
    #[error("cannot open the sample store {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    /// The writer thread could not be started.
    #[error("cannot start the writer thread of the sample store {}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A transaction, table or commit of the database failed. Shared, because one failed group
    /// commit fails every append of its batch.
    #[error("storage error in the sample store {}", path.display())]
    Storage {
        path: PathBuf,
        #[source]
        source: Arc<redb::Error>,
    },
    /// The sample references an image whose bytes it does not carry and the store does not keep;
    /// it was not stored.
    #[error(
        "the sample of session {session_id} turn {turn} references image {hash}, whose bytes it \
         does not carry and the store does not keep"
    )]
    MissingImage {
        hash: String,
        session_id: String,
        turn: u64,
    },
    /// The sample could not be encoded; it was not stored.
    #[error("cannot encode the sample of session {session_id} turn {turn}")]
    Encode {
        session_id: String,
        turn: u64,
        #[source]
        source: ps_core::codec::EncodeError,
    },
    /// A stored sample could not be decoded.
    #[error("cannot decode sample {seq} of the sample store {}", path.display())]
    Decode {
        seq: u64,
        path: PathBuf,
        #[source]
        source: ps_core::codec::DecodeError,
    },
    /// A metadata record of the database is missing or inconsistent.
    #[error("the sample store {} is inconsistent: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// The trainer tried to commit samples that do not exist yet.
    #[error("cannot commit through sample {through}: the last stored sample is {last_seq}")]
    CommitAhead { through: u64, last_seq: u64 },
    /// The store was closed (or its writer thread stopped); nothing was done.
    #[error("the sample store {} is closed", path.display())]
    Closed { path: PathBuf },
    /// Writing an export failed.
    #[error("cannot write the export of the sample store {}", path.display())]
    Export {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    pub(crate) fn storage(path: &std::path::Path, source: impl Into<redb::Error>) -> Self {
        Self::Storage {
            path: path.to_path_buf(),
            source: Arc::new(source.into()),
        }
    }

    /// The message of this error followed by those of its sources, `: `-separated: the form used
    /// where the error must become a string (`SinkError::Store`).
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(err) = source {
            text.push_str(": ");
            text.push_str(&err.to_string());
            source = err.source();
        }
        text
    }
}
