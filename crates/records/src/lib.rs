//! JSONL records written off the chat path: conversations, PRM scores and OPD judgements, one JSON
//! object per line, in files named `<prefix>_YYYYMMDD_HHMMSS.jsonl` (UTC; `_N` appended when the name
//! is taken) under one directory per kind.
//!
//! This crate owns the [`RecordWriter`]: a bounded queue drained by one dedicated OS thread that does
//! all serialisation and file I/O, so [`RecordWriter::record`] never blocks and never fails the
//! caller; a full queue or a failed write is counted and logged instead. Files are rotated by size and
//! on request ([`RecordWriter::rotate`], when the trainer pauses) and are never truncated or deleted.
//! It depends on no async runtime, web framework or other crate of the product.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{self, Receiver, SyncSender, TrySendError},
    },
    thread::JoinHandle,
};

use serde_json::Value;

/// Default [`RecordOptions::max_file_bytes`]: 256 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;
/// Default [`RecordOptions::queue`]: records waiting for the writer thread.
pub const DEFAULT_QUEUE: usize = 10_000;
/// Default [`RecordOptions::config_key`].
pub const DEFAULT_CONFIG_KEY: &str = "logging.record_dir";
/// Counter of records that never reached a file (named in the product's one catalogue).
pub use ps_core::metric_names::RECORDS_FAILED_TOTAL;

/// At most this many queued records are written between two flushes.
const MAX_BATCH: usize = 1024;
/// A batch buffer larger than this is written out early.
const MAX_BUFFER_BYTES: usize = 1024 * 1024;
/// Give up finding a free `_N` file name after this many tries.
const MAX_NAME_TRIES: u32 = 100_000;

/// Settings of one [`RecordWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOptions {
    /// Start a new file before a line would make the current one larger than this (a single larger
    /// line gets a file of its own).
    pub max_file_bytes: u64,
    /// Records waiting for the writer thread; more are dropped and counted. At least 1.
    pub queue: usize,
    /// The configuration key of the directory, named in errors (for example `logging.prm_record_dir`).
    pub config_key: &'static str,
}

impl Default for RecordOptions {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            queue: DEFAULT_QUEUE,
            config_key: DEFAULT_CONFIG_KEY,
        }
    }
}

/// Why a [`RecordWriter`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot create the record directory {} (check `{config_key}`): {source}", path.display())]
    CreateDir {
        path: PathBuf,
        config_key: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the record directory {} (`{config_key}`) exists but is not a directory", path.display())]
    NotADirectory {
        path: PathBuf,
        config_key: &'static str,
    },
    #[error("invalid record file prefix {prefix:?}: use ASCII letters, digits, '-' and '_'")]
    InvalidPrefix { prefix: String },
    #[error("cannot start the record writer thread for {} (`{config_key}`): {source}", path.display())]
    Spawn {
        path: PathBuf,
        config_key: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Counters of one writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordStats {
    /// Lines written to a file.
    pub written: u64,
    /// Records refused because the queue was full (or the writer thread had stopped).
    pub dropped: u64,
    /// Records whose write failed.
    pub failed: u64,
    /// Files created.
    pub files: u64,
}

enum Command {
    Record(Value),
    Rotate,
    /// Answered once everything queued before it is written (tests).
    #[cfg(test)]
    Barrier(mpsc::Sender<()>),
}

/// State shared by the callers and the writer thread.
struct Shared {
    written: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    files: AtomicU64,
    /// A `rotate()` that found the queue full; the writer honours it before its next record.
    rotate_pending: AtomicBool,
    /// Whether the last `record()` was refused (to log the start and the end of a dropping spell once).
    dropping: AtomicBool,
    queue_full: metrics::Counter,
    write_error: metrics::Counter,
    writer_stopped: metrics::Counter,
}

impl Shared {
    fn stats(&self) -> RecordStats {
        RecordStats {
            written: self.written.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            files: self.files.load(Ordering::Relaxed),
        }
    }
}

/// Appends JSON records to rotating JSONL files in one directory, from a dedicated thread.
///
/// Share it behind an `Arc`. Dropping it (or [`RecordWriter::shutdown`]) drains the queue, writes
/// everything out and joins the thread, which blocks for as long as that takes: do it at shutdown,
/// from a blocking context.
pub struct RecordWriter {
    tx: Option<SyncSender<Command>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    dir: PathBuf,
    prefix: String,
}

impl std::fmt::Debug for RecordWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("dir", &self.dir)
            .field("prefix", &self.prefix)
            .field("stats", &self.shared.stats())
            .finish_non_exhaustive()
    }
}

impl RecordWriter {
    /// Creates `dir` (with its parents) and starts the writer thread. No file is created before the
    /// first record.
    pub fn start(
        dir: PathBuf,
        prefix: &str,
        opts: RecordOptions,
    ) -> Result<RecordWriter, RecordError> {
        Self::start_inner(dir, prefix, opts, None)
    }

    fn start_inner(
        dir: PathBuf,
        prefix: &str,
        opts: RecordOptions,
        gate: Option<Receiver<()>>,
    ) -> Result<RecordWriter, RecordError> {
        let prefix_ok = !prefix.is_empty()
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
        if !prefix_ok {
            return Err(RecordError::InvalidPrefix {
                prefix: prefix.to_owned(),
            });
        }
        fs::create_dir_all(&dir).map_err(|source| RecordError::CreateDir {
            path: dir.clone(),
            config_key: opts.config_key,
            source,
        })?;
        if !dir.is_dir() {
            return Err(RecordError::NotADirectory {
                path: dir,
                config_key: opts.config_key,
            });
        }
        let counter = |reason: &'static str| metrics::counter!(RECORDS_FAILED_TOTAL, "kind" => prefix.to_owned(), "reason" => reason);
        let shared = Arc::new(Shared {
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            files: AtomicU64::new(0),
            rotate_pending: AtomicBool::new(false),
            dropping: AtomicBool::new(false),
            queue_full: counter("queue_full"),
            write_error: counter("write_error"),
            writer_stopped: counter("writer_stopped"),
        });
        let (tx, rx) = mpsc::sync_channel(opts.queue.max(1));
        let mut files = Files {
            dir: dir.clone(),
            prefix: prefix.to_owned(),
            max_file_bytes: opts.max_file_bytes,
            config_key: opts.config_key,
            current: None,
            failing: false,
            shared: shared.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("records-{prefix}"))
            .spawn(move || {
                if let Some(gate) = gate {
                    let _ = gate.recv();
                }
                files.run(&rx);
            })
            .map_err(|source| RecordError::Spawn {
                path: dir.clone(),
                config_key: opts.config_key,
                source,
            })?;
        Ok(RecordWriter {
            tx: Some(tx),
            thread: Some(thread),
            shared,
            dir,
            prefix: prefix.to_owned(),
        })
    }

    /// Queues one record (one line). Never blocks and never fails: a full queue drops the record,
    /// counts it ([`Self::dropped`], [`RECORDS_FAILED_TOTAL`]) and logs when dropping starts and ends.
    pub fn record(&self, value: Value) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(Command::Record(value)) {
            Ok(()) => {
                if self.shared.dropping.load(Ordering::Relaxed)
                    && self.shared.dropping.swap(false, Ordering::Relaxed)
                {
                    tracing::info!(
                        dir = %self.dir.display(),
                        kind = %self.prefix,
                        dropped_total = self.shared.dropped.load(Ordering::Relaxed),
                        "record queue accepts records again"
                    );
                }
            }
            Err(TrySendError::Full(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                self.shared.queue_full.increment(1);
                if !self.shared.dropping.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        dir = %self.dir.display(),
                        kind = %self.prefix,
                        "record queue is full; dropping records until the writer catches up"
                    );
                }
            }
            Err(TrySendError::Disconnected(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                self.shared.writer_stopped.increment(1);
                if !self.shared.dropping.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        dir = %self.dir.display(),
                        kind = %self.prefix,
                        "the record writer thread has stopped; dropping records"
                    );
                }
            }
        }
    }

    /// Asks the writer to close the current file; the next record starts a new one. Records queued
    /// before this call go to the old file (unless the queue is full, in which case the switch happens
    /// before the writer's next record). Never blocks; old files are kept intact.
    pub fn rotate(&self) {
        let Some(tx) = &self.tx else { return };
        if let Err(TrySendError::Full(_)) = tx.try_send(Command::Rotate) {
            self.shared.rotate_pending.store(true, Ordering::Relaxed);
        }
    }

    /// Records refused because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Records whose write failed.
    pub fn failed(&self) -> u64 {
        self.shared.failed.load(Ordering::Relaxed)
    }

    /// Lines written so far.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// All counters.
    pub fn stats(&self) -> RecordStats {
        self.shared.stats()
    }

    /// The directory this writer owns.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file-name prefix (the record kind).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Writes out everything queued, closes the file and stops the thread; returns the final counters.
    /// Blocks until done.
    pub fn shutdown(mut self) -> RecordStats {
        self.finish();
        self.shared.stats()
    }

    fn finish(&mut self) {
        // Disconnecting lets the thread drain what is queued, then stop.
        drop(self.tx.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!(
                dir = %self.dir.display(),
                kind = %self.prefix,
                "the record writer thread panicked; queued records may be lost"
            );
        }
    }

    /// Blocks until everything queued before the call is written (tests only).
    #[cfg(test)]
    fn barrier(&self) {
        let (done_tx, done_rx) = mpsc::channel();
        if let Some(tx) = &self.tx
            && tx.send(Command::Barrier(done_tx)).is_ok()
        {
            let _ = done_rx.recv();
        }
    }
}

impl Drop for RecordWriter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The open file and the lines buffered for it in the current batch.
struct OpenFile {
    path: PathBuf,
    file: File,
    /// Bytes in the file (written).
    bytes: u64,
    /// Lines of the current batch not yet written.
    buf: Vec<u8>,
    buf_lines: u64,
}

/// The writer thread's side.
struct Files {
    dir: PathBuf,
    prefix: String,
    max_file_bytes: u64,
    config_key: &'static str,
    current: Option<OpenFile>,
    /// Whether the last write failed (to log the start and the end of a failing spell once).
    failing: bool,
    shared: Arc<Shared>,
}

impl Files {
    fn run(&mut self, rx: &Receiver<Command>) {
        while let Ok(first) = rx.recv() {
            self.handle(first);
            for _ in 1..MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => break,
                }
            }
            self.write_out();
        }
        self.close();
    }

    fn handle(&mut self, cmd: Command) {
        if self.shared.rotate_pending.swap(false, Ordering::Relaxed) {
            self.close();
        }
        match cmd {
            Command::Record(value) => self.add(&value),
            Command::Rotate => self.close(),
            #[cfg(test)]
            Command::Barrier(done) => {
                self.write_out();
                let _ = done.send(());
            }
        }
    }

    /// Buffers one line, switching files first when it would overflow the current one.
    fn add(&mut self, value: &Value) {
        let mut line = match serde_json::to_vec(value) {
            Ok(l) => l,
            Err(e) => {
                self.fail(1, &format!("cannot serialise the record: {e}"), None);
                return;
            }
        };
        line.push(b'\n');
        if let Some(cur) = &self.current {
            let size = cur.bytes + cur.buf.len() as u64;
            if size > 0 && size + line.len() as u64 > self.max_file_bytes {
                self.close();
            }
        }
        if self.current.is_none() {
            match self.open() {
                Ok(f) => self.current = Some(f),
                Err((path, e)) => {
                    self.fail(1, &format!("cannot create a record file: {e}"), Some(&path));
                    return;
                }
            }
        }
        let over = match &mut self.current {
            Some(cur) => {
                cur.buf.extend_from_slice(&line);
                cur.buf_lines += 1;
                cur.buf.len() >= MAX_BUFFER_BYTES
            }
            None => false,
        };
        if over {
            self.write_out();
        }
    }

    /// Writes the buffered lines of the current file; on failure counts them as failed and drops the
    /// file, so the next record starts a fresh one.
    fn write_out(&mut self) {
        let Some(cur) = &mut self.current else { return };
        if cur.buf.is_empty() {
            return;
        }
        match cur.file.write_all(&cur.buf).and_then(|()| cur.file.flush()) {
            Ok(()) => {
                cur.bytes += cur.buf.len() as u64;
                self.shared
                    .written
                    .fetch_add(cur.buf_lines, Ordering::Relaxed);
                cur.buf.clear();
                cur.buf_lines = 0;
                if self.failing {
                    self.failing = false;
                    tracing::info!(
                        file = %cur.path.display(),
                        kind = %self.prefix,
                        "record writes succeed again"
                    );
                }
            }
            Err(e) => {
                let (lines, path) = (cur.buf_lines, cur.path.clone());
                self.current = None;
                self.fail(lines, &format!("cannot write records: {e}"), Some(&path));
            }
        }
    }

    /// Writes out and forgets the current file (it is left as it is).
    fn close(&mut self) {
        self.write_out();
        self.current = None;
    }

    fn fail(&mut self, lines: u64, what: &str, path: Option<&Path>) {
        self.shared.failed.fetch_add(lines, Ordering::Relaxed);
        self.shared.write_error.increment(lines);
        if !self.failing {
            self.failing = true;
            let path = path.unwrap_or(&self.dir);
            tracing::warn!(
                path = %path.display(),
                kind = %self.prefix,
                config_key = self.config_key,
                error = %what,
                "record write failed; records are counted and dropped until writes succeed again"
            );
        }
    }

    /// Creates a new file `<prefix>_YYYYMMDD_HHMMSS[_N].jsonl` (never opens an existing one).
    fn open(&mut self) -> Result<OpenFile, (PathBuf, io::Error)> {
        // The directory may have been removed since start; recreate it.
        fs::create_dir_all(&self.dir).map_err(|e| (self.dir.clone(), e))?;
        let stamp = chrono::Utc::now().format("%Y%m%d_%H%M%S").to_string();
        self.open_stamped(&stamp)
    }

    fn open_stamped(&mut self, stamp: &str) -> Result<OpenFile, (PathBuf, io::Error)> {
        let mut last = self.dir.clone();
        for n in 0..MAX_NAME_TRIES {
            let name = if n == 0 {
                format!("{}_{stamp}.jsonl", self.prefix)
            } else {
                format!("{}_{stamp}_{n}.jsonl", self.prefix)
            };
            let path = self.dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    self.shared.files.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(file = %path.display(), "record file created");
                    return Ok(OpenFile {
                        path,
                        file,
                        bytes: 0,
                        buf: Vec::new(),
                        buf_lines: 0,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = path,
                Err(e) => return Err((path, e)),
            }
        }
        Err((
            last,
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                "no free record file name for this second",
            ),
        ))
    }
}

#[cfg(test)]
mod tests;
