//! The durable store: one redb file, one writer thread doing group commits, reads on read
//! transactions (which never wait for the writer).
//!
//! Layout of the database file (`<dir>/samples.redb`):
//! - table `samples`: (seq, chunk) → piece `chunk` of the sample in MessagePack
//!   ([`crate::codec`]), cut into [`CHUNK_BYTES`] pieces numbered from 0. The seqs are a
//!   contiguous range `first_kept..=last_seq`: appends add at the top, compaction removes from the
//!   bottom.
//! - table `meta`: `last_seq` (the highest seq ever handed out, so seqs are never reused, even when
//!   compaction emptied `samples`) and `committed` (the trainer's commit point).
//! - tables `blobs`, `blob_refs`, `sample_images`: the images samples reference, once per content
//!   hash: (hash, chunk) → bytes, hash → how many kept samples reference it, seq → the hashes of
//!   that sample (written in the sample's transaction; a compacted sample releases its
//!   references, and a blob no kept sample references goes with it).
//!
//! Why one file of ~1,140 lines of code (and ~180 of unit tests at the end): the handle, the
//! group-commit writer thread, the read paths and the pending-turn table share these table
//! definitions, the chunking and the counters that keep seqs, the commit point and retention
//! consistent; the byte format is core's codec
//! ([`crate::codec`] maps its errors). The writer (`Writer`) would be the next cut.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ps_core::sample::Sample;
use ps_core::sink::{SampleSink, SinkError};
use ps_core::{EncodedSample, LogError, StoreStats, StoredSample};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::{mpsc, oneshot, watch};

use crate::{StoreError, codec};

/// The database file inside [`StoreConfig::path`].
pub const DB_FILE_NAME: &str = "samples.redb";
/// Default for [`StoreConfig::max_batch`].
pub const DEFAULT_MAX_BATCH: usize = 256;
/// Default for [`StoreConfig::retain_committed`]: committed samples are deleted at once.
pub const DEFAULT_RETAIN_COMMITTED: u64 = 0;
/// Default for [`StoreConfig::cache_bytes`]. redb's own default is 1 GiB, and redb keeps every page
/// it writes in that cache until the cache is full or the page is freed, so the store's memory grew
/// with every sample written, committed or not, up to 1 GiB: the store benchmark's process reached
/// 990 MiB for 10,000 samples of 90 KB, and the proxy kept the pages of its `retain_committed`
/// samples (~16 KB each in the soak). A sample is written once and read once, soon after, by the
/// trainer; the OS page cache keeps the file's recent pages either way. With 16 MiB the store
/// benchmark wrote as fast as with 1 GiB (90 KB samples; 2.8 MB top-K samples faster) and read
/// 90 KB samples as fast (2.8 MB ones ~20 % slower, still ~200 samples/s). 4 MiB since: the
/// same write and read rates for 90 KB samples as 16 MiB in the store benchmark, the same CPU in
/// the proxy's agent benchmark, and less RSS there (11–20 MiB at the peak, ~16 at the end);
/// 2.8 MB top-K samples written no slower in the OPD bench, one run each
/// (docs/benchmarks-history.md, "The store's page cache at 4 MiB", for what that bench cannot
/// show of reads).
pub const DEFAULT_CACHE_BYTES: usize = 4 * 1024 * 1024;
/// The request queue holds this many batches: appenders wait for room beyond it.
const QUEUE_BATCHES: usize = 2;
/// redb's quick repair is off: with it every commit also saves the allocator state (and commits in
/// two phases, two fsyncs), so that reopening after a crash is immediate instead of a walk over the
/// whole file. Measured (2,000–15,000 commits of a 96 KB sample, docs/benchmarks-history.md "The
/// store's commits without quick repair"): it cost 0.1–0.3 ms of CPU per commit, growing with the
/// file (0.58 against 0.31 ms at 2.3 GB), while the walk it spares takes ~1 s per GB of file after
/// a crash, once (2.6 s for 2.3 GB from a cold page cache). Commits are durable either way; the
/// walk is logged when it happens ([`log_repair`]).
const QUICK_REPAIR: bool = false;

/// The largest piece of an encoded sample stored under one key. redb gives a value larger than a
/// page a leaf of its own, rounded up to a power of two: a 90 KB sample stored whole costs 128 KB
/// of writes, cut into 16 KB pieces about 98 KB, and the disk is what limits the append rate.
const CHUNK_BYTES: usize = 16_000;

const SAMPLES: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("samples");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Turns persisted at shutdown before they became samples: (session id, turn) → MessagePack.
const PENDING: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("pending");
/// Images of kept samples, once per content hash (SHA-256, hex): (hash, chunk) → bytes.
const BLOBS: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("blobs");
/// Hash → how many kept samples reference the image.
const BLOB_REFS: TableDefinition<&str, u64> = TableDefinition::new("blob_refs");
/// Seq → the distinct hashes its sample references, joined with `,` (only samples with images).
const SAMPLE_IMAGES: TableDefinition<u64, &str> = TableDefinition::new("sample_images");
const META_LAST_SEQ: &str = "last_seq";
const META_COMMITTED: &str = "committed";

/// Where and how to keep samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The store directory; created if missing. The database is `<path>/samples.redb`.
    pub path: PathBuf,
    /// Keep this many committed samples before compaction deletes them; 0 = delete as soon as
    /// committed.
    pub retain_committed: u64,
    /// Maximum number of requests (appends and commits) written in one group commit. The request
    /// queue holds twice this many; appenders beyond that wait (backpressure). At least 1.
    pub max_batch: usize,
    /// redb's page cache (reads and the write buffer), in bytes: what the store holds in memory
    /// at most, besides the batch being written.
    pub cache_bytes: usize,
}

impl StoreConfig {
    /// A config for `path` with the default retention and batch size.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            retain_committed: DEFAULT_RETAIN_COMMITTED,
            max_batch: DEFAULT_MAX_BATCH,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// The durable sample store. Cheap to clone (all clones share one database and one writer);
/// `Send + Sync`.
///
/// Every method that touches the disk runs off the async executor: appends and commits on the
/// store's writer thread, reads on tokio's blocking pool. [`SampleStore::export_jsonl`] is the
/// exception: it is blocking, for command-line tools.
#[derive(Clone)]
pub struct SampleStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Database>,
    file: PathBuf,
    requests: mpsc::Sender<Request>,
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// What the writer thread publishes after each durable commit.
struct Shared {
    last_seq: watch::Sender<u64>,
    counters: Mutex<Counters>,
    /// Durable write transactions so far (group commits of appends and trainer commits).
    transactions: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counters {
    last_seq: u64,
    committed: u64,
    /// The lowest seq still stored (`last_seq + 1` when none is).
    first_kept: u64,
}

impl Counters {
    fn stats(self) -> StoreStats {
        StoreStats {
            last_seq: self.last_seq,
            committed: self.committed,
            stored: (self.last_seq + 1).saturating_sub(self.first_kept),
            lag: self.last_seq.saturating_sub(self.committed),
        }
    }
}

enum Request {
    Append {
        bytes: Vec<u8>,
        images: Vec<ImageBlob>,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    Commit {
        through: u64,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

impl Request {
    /// Answers a request that arrived after the store was closed.
    fn refuse(self, file: &Path) {
        let closed = || StoreError::Closed {
            path: file.to_path_buf(),
        };
        // A dropped receiver means the caller gave up waiting: nothing to tell it.
        match self {
            Request::Append { reply, .. } => {
                let _ = reply.send(Err(closed()));
            }
            Request::Commit { reply, .. } => {
                let _ = reply.send(Err(closed()));
            }
            Request::Close { reply } => {
                let _ = reply.send(());
            }
        }
    }
}

impl std::fmt::Debug for SampleStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleStore")
            .field("file", &self.inner.file)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl SampleStore {
    /// Opens the store at `config.path`, creating the directory and the database if missing.
    /// Reopening resumes `last_seq` and the commit point, and applies the retention of `config`
    /// to what is already committed. Blocking (file I/O); call it before serving or from
    /// `spawn_blocking`.
    pub fn open(config: StoreConfig) -> Result<Self, StoreError> {
        if config.max_batch == 0 {
            return Err(StoreError::Config {
                field: "max_batch",
                value: config.max_batch.to_string(),
                reason: "must be at least 1",
            });
        }
        std::fs::create_dir_all(&config.path).map_err(|source| StoreError::CreateDir {
            path: config.path.clone(),
            source,
        })?;
        let file = config.path.join(DB_FILE_NAME);
        let repairing = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let db = Database::builder()
            .set_cache_size(config.cache_bytes)
            .set_repair_callback(log_repair(file.clone(), repairing.clone()))
            .create(&file)
            .map_err(|source| StoreError::Open {
                path: file.clone(),
                source,
            })?;
        if repairing.load(Ordering::Relaxed) {
            tracing::warn!(
                file = %file.display(),
                "the sample store was checked in {:.1} s; no committed sample is lost",
                started.elapsed().as_secs_f64()
            );
        }
        let counters = load(&db, config.retain_committed).map_err(|err| match err {
            LoadError::Storage(source) => StoreError::storage(&file, source),
            LoadError::Corrupt(reason) => StoreError::Corrupt {
                path: file.clone(),
                reason,
            },
        })?;

        let db = Arc::new(db);
        let (last_seq, _) = watch::channel(counters.last_seq);
        let shared = Arc::new(Shared {
            last_seq,
            counters: Mutex::new(counters),
            transactions: AtomicU64::new(0),
        });
        let (requests, queue) = mpsc::channel(config.max_batch.saturating_mul(QUEUE_BATCHES));
        let writer = Writer {
            db: Arc::clone(&db),
            file: file.clone(),
            queue,
            shared: Arc::clone(&shared),
            counters,
            retain_committed: config.retain_committed,
            max_batch: config.max_batch,
        };
        let handle = std::thread::Builder::new()
            .name("sample-store-writer".into())
            .spawn(move || writer.run())
            .map_err(|source| StoreError::Spawn {
                path: file.clone(),
                source,
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                file,
                requests,
                shared,
                writer: Mutex::new(Some(handle)),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.file
    }

    /// Stores `sample` and returns its seq once the write is durable (synced to disk, together
    /// with the rest of its group commit). The stored sample has `index == group_index == seq`.
    ///
    /// Waits for room when the writer's queue is full. If the future is dropped after the
    /// sample was queued, the sample is still stored (delivery is at-least-once).
    pub async fn append(&self, sample: &Sample) -> Result<u64, StoreError> {
        // CPU only (tens of microseconds for a 5k-token sample), like a JSON body in a handler;
        // done here so appenders encode in parallel and the writer thread only writes.
        let bytes = codec::encode(sample)?;
        let images = image_blobs(sample);
        // An image without its bytes can only be referenced if it is kept: refused here, so that
        // it never fails the group commit of other appends (only a compaction in between could,
        // and then that batch's appenders retry).
        for image in images.iter().filter(|i| i.bytes.is_none()) {
            if self.blob(&image.hash).await?.is_none() {
                return Err(StoreError::MissingImage {
                    hash: image.hash.clone(),
                    session_id: sample.session_id.clone(),
                    turn: sample.turn,
                });
            }
        }
        let (reply, answer) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Append {
                bytes,
                images,
                reply,
            })
            .await
            .map_err(|_| self.closed())?;
        answer.await.map_err(|_| self.closed())?
    }

    /// Up to `max` stored samples with `seq > after`, ascending. Samples already deleted by
    /// compaction are skipped; an empty result means nothing newer is stored yet.
    pub async fn read(&self, after: u64, max: usize) -> Result<Vec<StoredSample>, StoreError> {
        self.read_with(after, max, codec::decoded).await
    }

    /// The samples [`SampleStore::read`] returns, as the records they are stored as (not
    /// decoded; checked to be whole records, else decoded and encoded again, and one that does not
    /// decode is [`StoreError::Decode`] as for `read`): what a trainer's MessagePack page is
    /// written from.
    pub async fn read_records(
        &self,
        after: u64,
        max: usize,
    ) -> Result<Vec<EncodedSample>, StoreError> {
        self.read_with(after, max, codec::checked).await
    }

    async fn read_with<T: Send + 'static>(
        &self,
        after: u64,
        max: usize,
        each: fn(u64, Vec<u8>, &Path) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        if max == 0 || after >= self.stats().last_seq {
            return Ok(Vec::new());
        }
        let db = Arc::clone(&self.inner.db);
        let file = self.inner.file.clone();
        let read = tokio::task::spawn_blocking(move || read_range(&db, &file, after, max, each));
        match read.await {
            Ok(result) => result,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(self.closed()),
        }
    }

    /// The bytes of the image stored under `hash`, while a kept sample references it.
    pub async fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let db = Arc::clone(&self.inner.db);
        let file = self.inner.file.clone();
        let hash = hash.to_owned();
        let read = tokio::task::spawn_blocking(move || read_blob(&db, &hash));
        match read.await {
            Ok(result) => result.map_err(|source| StoreError::Storage {
                path: file,
                source: Arc::new(source),
            }),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(self.closed()),
        }
    }

    /// How many distinct images the store keeps (for tests and status).
    pub fn blob_count(&self) -> Result<u64, StoreError> {
        let count = || -> Result<u64, redb::Error> {
            let txn = self.inner.db.begin_read()?;
            match txn.open_table(BLOB_REFS) {
                Ok(t) => Ok(t.len()?),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(e.into()),
            }
        };
        count().map_err(|source| StoreError::Storage {
            path: self.inner.file.clone(),
            source: Arc::new(source),
        })
    }

    /// Waits until `last_seq > after` and returns it, or returns the current `last_seq` once
    /// `timeout` has passed (long-poll support).
    pub async fn wait_newer(&self, after: u64, timeout: Duration) -> u64 {
        let mut last_seq = self.inner.shared.last_seq.subscribe();
        // Err is either the timeout or a dropped sender, which `self` keeps alive: in both
        // cases the current value is the answer.
        let _ = tokio::time::timeout(timeout, last_seq.wait_for(|seq| *seq > after)).await;
        *last_seq.borrow()
    }

    /// Records that the trainer has consumed every sample up to `through`, durably. A value
    /// below the current commit point is a no-op (the point never moves back); a value above
    /// `last_seq` is [`StoreError::CommitAhead`]. Committing deletes the committed samples beyond
    /// the `retain_committed` most recent ones, in the same transaction.
    pub async fn commit(&self, through: u64) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Commit { through, reply })
            .await
            .map_err(|_| self.closed())?;
        answer.await.map_err(|_| self.closed())?
    }

    /// The counters as of the last durable commit.
    pub fn stats(&self) -> StoreStats {
        self.inner
            .shared
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stats()
    }

    /// Durable write transactions this handle's writer made since the store was opened: group
    /// commits of appends and of the trainer's commits (a batch with nothing to change writes none).
    /// Samples appended ÷ this is the mean group-commit size.
    pub fn transactions(&self) -> u64 {
        self.inner.shared.transactions.load(Ordering::Relaxed)
    }

    /// Bytes in the database's page cache now (at most about [`StoreConfig::cache_bytes`]).
    pub fn cache_used_bytes(&self) -> usize {
        self.inner.db.cache_stats().used_bytes()
    }

    /// Writes every kept sample to `out` as one JSON line `{"seq":..,"sample":{..}}`, ascending,
    /// from one consistent snapshot, and returns how many. Blocking: for command-line tools (in
    /// async code, call it inside `spawn_blocking`). JSON has no NaN or infinity: such `f64`
    /// values are written as `null`.
    pub fn export_jsonl(&self, out: impl std::io::Write) -> Result<u64, StoreError> {
        let file = &self.inner.file;
        let txn = self
            .inner
            .db
            .begin_read()
            .map_err(|err| StoreError::storage(file, err))?;
        let table = txn
            .open_table(SAMPLES)
            .map_err(|err| StoreError::storage(file, err))?;
        let range = table
            .range::<(u64, u32)>(..)
            .map_err(|err| StoreError::storage(file, err))?;
        let mut out = std::io::BufWriter::new(out);
        let export_err = |source: std::io::Error| StoreError::Export {
            path: file.clone(),
            source,
        };
        let mut count = 0;
        for_each_sample(range, file, |stored| {
            serde_json::to_writer(&mut out, &stored)
                .map_err(|err| export_err(std::io::Error::from(err)))?;
            out.write_all(b"\n").map_err(export_err)?;
            count += 1;
            Ok(true)
        })?;
        out.flush().map_err(export_err)?;
        Ok(count)
    }

    /// Stops the writer after everything queued before this call is written, then closes the
    /// database if this was the last handle. Appends and commits of other clones fail with
    /// [`StoreError::Closed`] afterwards; reads keep working while a clone is alive.
    ///
    /// Nothing is lost without it either (an append returns only once durable), but closing
    /// marks the file as cleanly shut down and surfaces close errors.
    pub async fn close(self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        if self
            .inner
            .requests
            .send(Request::Close { reply })
            .await
            .is_ok()
        {
            // Err: the writer already stopped.
            let _ = answer.await;
        }
        let handle = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let file = self.inner.file.clone();
        let db = Arc::try_unwrap(self.inner)
            .ok()
            .and_then(|inner| Arc::try_unwrap(inner.db).ok());
        let closing = tokio::task::spawn_blocking(move || {
            if let Some(handle) = handle
                && let Err(panic) = handle.join()
            {
                std::panic::resume_unwind(panic);
            }
            match db {
                Some(db) => db.close(),
                None => Ok(()),
            }
        });
        match closing.await {
            Ok(result) => result.map_err(|err| StoreError::storage(&file, err)),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(StoreError::Closed { path: file }),
        }
    }

    fn closed(&self) -> StoreError {
        StoreError::Closed {
            path: self.inner.file.clone(),
        }
    }
}

#[async_trait::async_trait]
impl ps_core::SampleLog for SampleStore {
    async fn read(
        &self,
        after: u64,
        max: usize,
        _consumer: &str,
    ) -> Result<Vec<StoredSample>, LogError> {
        SampleStore::read(self, after, max).await.map_err(into_log)
    }

    async fn read_records(
        &self,
        after: u64,
        max: usize,
        _consumer: &str,
    ) -> Result<Vec<EncodedSample>, LogError> {
        SampleStore::read_records(self, after, max)
            .await
            .map_err(into_log)
    }

    async fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, LogError> {
        SampleStore::blob(self, hash).await.map_err(into_log)
    }

    fn keeps_images(&self) -> bool {
        true
    }

    async fn get(&self, seq: u64) -> Result<Option<StoredSample>, LogError> {
        let Some(after) = seq.checked_sub(1) else {
            return Ok(None);
        };
        let found = SampleStore::read(self, after, 1).await.map_err(into_log)?;
        Ok(found.into_iter().find(|s| s.seq == seq))
    }

    async fn wait_newer(&self, after: u64, timeout: Duration) -> Result<u64, LogError> {
        Ok(SampleStore::wait_newer(self, after, timeout).await)
    }

    async fn commit(&self, through: u64, _consumer: &str) -> Result<(), LogError> {
        SampleStore::commit(self, through).await.map_err(into_log)
    }

    async fn stats(&self) -> Result<StoreStats, LogError> {
        Ok(SampleStore::stats(self))
    }

    async fn close(&self) -> Result<(), LogError> {
        SampleStore::close(self.clone()).await.map_err(into_log)
    }

    fn describe(&self) -> String {
        format!("embedded store {}", self.inner.file.display())
    }
}

fn into_log(err: StoreError) -> LogError {
    match err {
        StoreError::CommitAhead { through, last_seq } => {
            LogError::CommitAhead { through, last_seq }
        }
        other => LogError::store(other.chain()),
    }
}

#[async_trait::async_trait]
impl SampleSink for SampleStore {
    async fn submit(&self, sample: &Sample) -> Result<u64, SinkError> {
        self.append(sample)
            .await
            .map_err(|err| SinkError::Store(err.chain()))
    }
}

enum LoadError {
    Storage(redb::Error),
    Corrupt(String),
}

impl<E: Into<redb::Error>> From<E> for LoadError {
    fn from(err: E) -> Self {
        LoadError::Storage(err.into())
    }
}

/// redb's repair callback: says once, when opening starts a repair, why the start takes longer (the
/// file was not closed: a crash, `kill -9` or a power loss), and marks `repairing`.
fn log_repair(
    file: PathBuf,
    repairing: Arc<AtomicBool>,
) -> impl Fn(&mut redb::RepairSession) + 'static {
    move |_session| {
        if !repairing.swap(true, Ordering::Relaxed) {
            let size = std::fs::metadata(&file).map_or(0, |m| m.len());
            tracing::warn!(
                file = %file.display(),
                "the sample store was not closed cleanly (a crash or kill): checking its {:.2} GB before start, about 1 s per GB",
                size as f64 / 1e9
            );
        }
    }
}

/// Creates the tables if missing, reads the counters and applies retention.
fn load(db: &Database, retain_committed: u64) -> Result<Counters, LoadError> {
    let mut txn = db.begin_write()?;
    txn.set_quick_repair(QUICK_REPAIR);
    let counters = {
        let mut samples = txn.open_table(SAMPLES)?;
        let meta = txn.open_table(META)?;
        let last_seq = meta.get(META_LAST_SEQ)?.map_or(0, |v| v.value());
        let committed = meta.get(META_COMMITTED)?.map_or(0, |v| v.value());
        let highest = samples.last()?.map(|(key, _)| key.value().0);
        let lowest = samples.first()?.map(|(key, _)| key.value().0);
        if let Some(highest) = highest
            && highest > last_seq
        {
            return Err(LoadError::Corrupt(format!(
                "sample {highest} is stored but last_seq is {last_seq}"
            )));
        }
        if committed > last_seq {
            return Err(LoadError::Corrupt(format!(
                "committed {committed} is beyond last_seq {last_seq}"
            )));
        }
        let mut counters = Counters {
            last_seq,
            committed,
            first_kept: lowest.unwrap_or(last_seq + 1),
        };
        let mut images = ImageTables {
            blobs: txn.open_table(BLOBS)?,
            refs: txn.open_table(BLOB_REFS)?,
            by_seq: txn.open_table(SAMPLE_IMAGES)?,
        };
        compact(&mut samples, &mut images, &mut counters, retain_committed)?;
        counters
    };
    txn.commit()?;
    Ok(counters)
}

/// An image a sample references: its hash and, while it travels, its bytes.
struct ImageBlob {
    hash: String,
    bytes: Option<Arc<[u8]>>,
}

/// Everything `sample` references by hash, each once: its images in prompt order, then its
/// blocks of routed experts (kept, counted and released as images are).
fn image_blobs(sample: &Sample) -> Vec<ImageBlob> {
    sample
        .blobs()
        .into_iter()
        .map(|b| ImageBlob {
            hash: b.hash.to_owned(),
            bytes: b.bytes.cloned(),
        })
        .collect()
}

/// The image stored under `hash`, its chunks joined; `None` when no kept sample references it.
fn read_blob(db: &Database, hash: &str) -> Result<Option<Vec<u8>>, redb::Error> {
    let txn = db.begin_read()?;
    let blobs = match txn.open_table(BLOBS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    let mut found = false;
    for entry in blobs.range((hash, 0)..=(hash, u32::MAX))? {
        let (_, v) = entry?;
        out.extend_from_slice(v.value());
        found = true;
    }
    Ok(found.then_some(out))
}

/// The images tables of one write transaction.
struct ImageTables<'t> {
    blobs: redb::Table<'t, (&'static str, u32), &'static [u8]>,
    refs: redb::Table<'t, &'static str, u64>,
    by_seq: redb::Table<'t, u64, &'static str>,
}

impl ImageTables<'_> {
    /// References `images` from the sample `seq`: a new hash's bytes are written, a known one's
    /// count goes up. An image without bytes whose hash is not kept cannot be stored.
    fn reference(&mut self, seq: u64, images: &[ImageBlob]) -> Result<(), redb::Error> {
        if images.is_empty() {
            return Ok(());
        }
        for image in images {
            let count = self.refs.get(image.hash.as_str())?.map(|v| v.value());
            match (count, &image.bytes) {
                (Some(n), _) => {
                    self.refs.insert(image.hash.as_str(), n + 1)?;
                }
                (None, Some(bytes)) => {
                    for (chunk, piece) in (0u32..).zip(bytes.chunks(CHUNK_BYTES)) {
                        self.blobs.insert((image.hash.as_str(), chunk), piece)?;
                    }
                    if bytes.is_empty() {
                        self.blobs.insert((image.hash.as_str(), 0), &[][..])?;
                    }
                    self.refs.insert(image.hash.as_str(), 1)?;
                }
                (None, None) => {
                    return Err(redb::Error::Corrupted(format!(
                        "sample {seq} references image {} whose bytes are neither given nor kept",
                        image.hash
                    )));
                }
            }
        }
        let hashes: Vec<&str> = images.iter().map(|i| i.hash.as_str()).collect();
        self.by_seq.insert(seq, hashes.join(",").as_str())?;
        Ok(())
    }

    /// Releases the references of the samples up to `cut` (compacted): an image no kept sample
    /// references is deleted.
    fn release_through(&mut self, cut: u64) -> Result<(), redb::Error> {
        let released: Vec<(u64, String)> = self
            .by_seq
            .range(..=cut)?
            .map(|e| e.map(|(k, v)| (k.value(), v.value().to_owned())))
            .collect::<Result<_, _>>()?;
        for (seq, hashes) in released {
            for hash in hashes.split(',').filter(|h| !h.is_empty()) {
                let count = self.refs.get(hash)?.map_or(0, |v| v.value());
                if count > 1 {
                    self.refs.insert(hash, count - 1)?;
                } else {
                    self.refs.remove(hash)?;
                    self.blobs
                        .retain_in((hash, 0)..=(hash, u32::MAX), |_, _| false)?;
                }
            }
            self.by_seq.remove(seq)?;
        }
        Ok(())
    }
}

/// Deletes the committed samples beyond the `retain_committed` most recent ones, and releases
/// their images.
fn compact(
    samples: &mut redb::Table<'_, (u64, u32), &[u8]>,
    images: &mut ImageTables<'_>,
    counters: &mut Counters,
    retain_committed: u64,
) -> Result<(), redb::Error> {
    let cut = counters.committed.saturating_sub(retain_committed);
    if cut >= counters.first_kept {
        samples.retain_in(..=(cut, u32::MAX), |_, _| false)?;
        images.release_through(cut)?;
        counters.first_kept = cut + 1;
    }
    Ok(())
}

fn read_range<T>(
    db: &Database,
    file: &Path,
    after: u64,
    max: usize,
    each: fn(u64, Vec<u8>, &Path) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let txn = db
        .begin_read()
        .map_err(|err| StoreError::storage(file, err))?;
    let table = txn
        .open_table(SAMPLES)
        .map_err(|err| StoreError::storage(file, err))?;
    let Some(first) = after.checked_add(1) else {
        return Ok(Vec::new());
    };
    let range = table
        .range::<(u64, u32)>((first, 0)..)
        .map_err(|err| StoreError::storage(file, err))?;
    let mut out = Vec::with_capacity(max.min(1024));
    for_each_record(range, file, |seq, record| {
        out.push(each(seq, record, file)?);
        Ok(out.len() < max)
    })?;
    Ok(out)
}

/// Reassembles and decodes the samples whose chunks `range` yields, calling `each` with every
/// sample in seq order while it returns `Ok(true)`.
fn for_each_sample(
    range: redb::Range<'_, (u64, u32), &'static [u8]>,
    file: &Path,
    mut each: impl FnMut(StoredSample) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    for_each_record(range, file, |seq, record| {
        each(codec::decoded(seq, record, file)?)
    })
}

/// Reassembles the records whose chunks `range` yields, calling `each` with every sample's seq
/// and record in seq order while it returns `Ok(true)`.
///
/// A record's chunks are held (redb's guards, no copy) until the next seq shows that it is whole,
/// then copied once into a buffer of its exact size: a trainer page reads hundreds of records of
/// tens of kB, and growing each buffer chunk by chunk copied most bytes twice more and touched
/// fresh pages at every doubling.
fn for_each_record(
    range: redb::Range<'_, (u64, u32), &'static [u8]>,
    file: &Path,
    mut each: impl FnMut(u64, Vec<u8>) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        path: file.to_path_buf(),
        reason,
    };
    let whole = |chunks: &[redb::AccessGuard<'_, &'static [u8]>]| {
        let mut bytes = Vec::with_capacity(chunks.iter().map(|c| c.value().len()).sum());
        for c in chunks {
            bytes.extend_from_slice(c.value());
        }
        bytes
    };
    // The sample being reassembled: its seq and its chunks so far (chunk i at index i).
    let mut seq_now: Option<u64> = None;
    let mut chunks = Vec::new();
    for entry in range {
        let (key, value) = entry.map_err(|err| StoreError::storage(file, err))?;
        let (seq, chunk) = key.value();
        if seq_now == Some(seq) {
            if chunk as usize != chunks.len() {
                return Err(corrupt(format!(
                    "sample {seq} has chunk {chunk} where chunk {} belongs",
                    chunks.len()
                )));
            }
        } else {
            if let Some(done) = seq_now.take() {
                let record = whole(&chunks);
                chunks.clear();
                if !each(done, record)? {
                    return Ok(());
                }
            }
            if chunk != 0 {
                return Err(corrupt(format!("sample {seq} starts at chunk {chunk}")));
            }
            seq_now = Some(seq);
        }
        chunks.push(value);
    }
    if let Some(done) = seq_now {
        each(done, whole(&chunks))?;
    }
    Ok(())
}

/// The writer thread: takes whatever is queued (up to `max_batch`), writes it in one durable
/// transaction, then answers each request.
struct Writer {
    db: Arc<Database>,
    file: PathBuf,
    queue: mpsc::Receiver<Request>,
    shared: Arc<Shared>,
    /// As of the last durable commit.
    counters: Counters,
    retain_committed: u64,
    max_batch: usize,
}

/// An append of the batch being written, with the seq it gets.
struct PendingAppend {
    seq: u64,
    bytes: Vec<u8>,
    images: Vec<ImageBlob>,
    reply: oneshot::Sender<Result<u64, StoreError>>,
}

/// The durable answers of one batch, sent once its transaction committed.
struct Batch {
    appends: Vec<PendingAppend>,
    commits: Vec<oneshot::Sender<Result<(), StoreError>>>,
    close: Option<oneshot::Sender<()>>,
}

impl Writer {
    fn run(mut self) {
        let mut requests = Vec::with_capacity(self.max_batch);
        let close = loop {
            // None: every handle was dropped.
            let Some(first) = self.queue.blocking_recv() else {
                break None;
            };
            requests.push(first);
            while requests.len() < self.max_batch {
                match self.queue.try_recv() {
                    Ok(request) => requests.push(request),
                    Err(_) => break,
                }
            }
            if let Some(close) = self.write_batch(&mut requests) {
                break Some(close);
            }
        };
        self.queue.close();
        while let Ok(request) = self.queue.try_recv() {
            request.refuse(&self.file);
        }
        // Release the database before answering, so that `close` can close it.
        let Writer { db, .. } = self;
        drop(db);
        if let Some(close) = close {
            let _ = close.send(());
        }
    }

    /// Writes and answers `requests` (drained); returns the reply of a close request, after
    /// which the writer stops.
    fn write_batch(&mut self, requests: &mut Vec<Request>) -> Option<oneshot::Sender<()>> {
        let mut next = self.counters;
        let mut batch = Batch {
            appends: Vec::with_capacity(requests.len()),
            commits: Vec::new(),
            close: None,
        };
        for request in requests.drain(..) {
            if batch.close.is_some() {
                request.refuse(&self.file);
                continue;
            }
            match request {
                Request::Append {
                    bytes,
                    images,
                    reply,
                } => {
                    next.last_seq += 1;
                    batch.appends.push(PendingAppend {
                        seq: next.last_seq,
                        bytes,
                        images,
                        reply,
                    });
                }
                // Checked against what is durable: a trainer can only have read that.
                Request::Commit { through, reply } if through > self.counters.last_seq => {
                    let _ = reply.send(Err(StoreError::CommitAhead {
                        through,
                        last_seq: self.counters.last_seq,
                    }));
                }
                Request::Commit { through, reply } => {
                    next.committed = next.committed.max(through);
                    batch.commits.push(reply);
                }
                Request::Close { reply } => batch.close = Some(reply),
            }
        }

        let written = if next == self.counters {
            Ok(())
        } else {
            self.write(&batch.appends, &mut next)
        };
        match written {
            Ok(()) => {
                self.counters = next;
                self.publish();
                for append in batch.appends {
                    let _ = append.reply.send(Ok(append.seq));
                }
                for reply in batch.commits {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(err) => {
                let err = Arc::new(err);
                let failed = || StoreError::Storage {
                    path: self.file.clone(),
                    source: Arc::clone(&err),
                };
                for append in batch.appends {
                    let _ = append.reply.send(Err(failed()));
                }
                for reply in batch.commits {
                    let _ = reply.send(Err(failed()));
                }
            }
        }
        batch.close
    }

    /// One durable transaction: the appends, the new counters and the compaction they allow.
    /// `next.first_kept` is updated by the compaction.
    fn write(&self, appends: &[PendingAppend], next: &mut Counters) -> Result<(), redb::Error> {
        let mut txn = self.db.begin_write()?;
        txn.set_quick_repair(QUICK_REPAIR);
        {
            let mut samples = txn.open_table(SAMPLES)?;
            let mut images = ImageTables {
                blobs: txn.open_table(BLOBS)?,
                refs: txn.open_table(BLOB_REFS)?,
                by_seq: txn.open_table(SAMPLE_IMAGES)?,
            };
            for append in appends {
                if append.bytes.is_empty() {
                    samples.insert((append.seq, 0), append.bytes.as_slice())?;
                }
                for (chunk, piece) in (0u32..).zip(append.bytes.chunks(CHUNK_BYTES)) {
                    samples.insert((append.seq, chunk), piece)?;
                }
                images.reference(append.seq, &append.images)?;
            }
            let mut meta = txn.open_table(META)?;
            if next.last_seq != self.counters.last_seq {
                meta.insert(META_LAST_SEQ, next.last_seq)?;
            }
            if next.committed != self.counters.committed {
                meta.insert(META_COMMITTED, next.committed)?;
                compact(&mut samples, &mut images, next, self.retain_committed)?;
            }
        }
        txn.commit()?;
        self.shared.transactions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn publish(&self) {
        *self
            .shared
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = self.counters;
        let last_seq = self.counters.last_seq;
        self.shared.last_seq.send_if_modified(|current| {
            let changed = *current != last_seq;
            *current = last_seq;
            changed
        });
    }
}

#[async_trait::async_trait]
impl ps_core::PendingStore for SampleStore {
    async fn save_pending(
        &self,
        turns: Vec<ps_core::PendingTurn>,
    ) -> Result<usize, ps_core::SinkError> {
        let db = self.inner.db.clone();
        let file = self.inner.file.clone();
        let n = turns.len();
        tokio::task::spawn_blocking(move || -> Result<(), StoreError> {
            let storage = |e: redb::Error| StoreError::storage(&file, e);
            let txn = db.begin_write().map_err(|e| storage(e.into()))?;
            {
                let mut table = txn.open_table(PENDING).map_err(|e| storage(e.into()))?;
                for t in &turns {
                    let bytes =
                        ps_core::codec::encode_pending(t).map_err(|e| StoreError::Encode {
                            session_id: t.turn.session_id.clone(),
                            turn: t.turn.turn,
                            source: e,
                        })?;
                    table
                        .insert((t.turn.session_id.as_str(), t.turn.turn), bytes.as_slice())
                        .map_err(|e| storage(e.into()))?;
                }
            }
            txn.commit().map_err(|e| storage(e.into()))?;
            Ok(())
        })
        .await
        .map_err(|e| ps_core::SinkError::Store(format!("saving pending turns panicked: {e}")))?
        .map_err(|e| ps_core::SinkError::Store(e.chain()))?;
        Ok(n)
    }

    async fn take_pending(&self) -> Result<Vec<ps_core::PendingTurn>, ps_core::SinkError> {
        let db = self.inner.db.clone();
        let file = self.inner.file.clone();
        tokio::task::spawn_blocking(move || -> Result<Vec<ps_core::PendingTurn>, StoreError> {
            let storage = |e: redb::Error| StoreError::storage(&file, e);
            let txn = db.begin_write().map_err(|e| storage(e.into()))?;
            let mut out = Vec::new();
            {
                let mut table = txn.open_table(PENDING).map_err(|e| storage(e.into()))?;
                for entry in table.iter().map_err(|e| storage(e.into()))? {
                    let (_, value) = entry.map_err(|e| storage(e.into()))?;
                    let turn = ps_core::codec::decode_pending(value.value()).map_err(|e| {
                        StoreError::Corrupt {
                            path: file.clone(),
                            reason: format!("a pending turn does not decode: {e}"),
                        }
                    })?;
                    out.push(turn);
                }
                table.retain(|_, _| false).map_err(|e| storage(e.into()))?;
            }
            txn.commit().map_err(|e| storage(e.into()))?;
            Ok(out)
        })
        .await
        .map_err(|e| ps_core::SinkError::Store(format!("reading pending turns panicked: {e}")))?
        .map_err(|e| ps_core::SinkError::Store(e.chain()))
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableTableMetadata;

    use super::*;

    fn big_sample() -> Sample {
        Sample {
            session_id: "big".into(),
            rollout_log_probs: (0..5_000).map(|i| -f64::from(i) / 7.0).collect(),
            ..Sample::default()
        }
    }

    #[test]
    fn handles_are_send_sync_and_clone() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<SampleStore>();
        check::<crate::ChannelSink>();
    }

    /// Records of several chunks each, and of one, read in one page: each comes back exactly as
    /// encoded, none running into the next (they are reassembled from redb's chunks).
    #[tokio::test]
    async fn records_of_many_chunks_read_together_come_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
        let samples: Vec<Sample> = (0..4)
            .map(|i| Sample {
                session_id: format!("s{i}"),
                // Records of 1, 3, 6 and 9 chunks (0.4, 45, 90 and 135 kB), each its own values.
                rollout_log_probs: (0..i * 5_000).map(|k| -f64::from(k + i) / 7.0).collect(),
                ..Sample::default()
            })
            .collect();
        for s in &samples {
            store.append(s).await.unwrap();
        }
        let records = store.read_records(0, 10).await.unwrap();
        assert_eq!(records.len(), samples.len());
        for (i, (r, s)) in records.iter().zip(&samples).enumerate() {
            let expected = EncodedSample::from_sample(i as u64 + 1, s).unwrap();
            assert_eq!(r.seq(), i as u64 + 1);
            assert_eq!(r.record(), expected.record(), "record {i}");
        }
        // A page that stops inside the run of records.
        let two = store.read_records(1, 2).await.unwrap();
        assert_eq!(
            two.iter().map(EncodedSample::seq).collect::<Vec<_>>(),
            [2, 3]
        );
        assert_eq!(two[0].record(), records[1].record());
        assert_eq!(two[1].record(), records[2].record());
        // A record of many chunks followed by one of a single chunk.
        store.append(&samples[0]).await.unwrap();
        let tail = store.read_records(3, 10).await.unwrap();
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0].record(), records[3].record());
        let single = EncodedSample::from_sample(5, &samples[0]).unwrap();
        assert_eq!(tail[1].record(), single.record());
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_sample_is_stored_in_chunks_and_a_missing_chunk_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
        let seq = store.append(&big_sample()).await.unwrap();
        assert_eq!(store.read(0, 1).await.unwrap()[0].sample.session_id, "big");
        store.close().await.unwrap();

        let file = dir.path().join(DB_FILE_NAME);
        {
            let db = Database::create(&file).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut samples = txn.open_table(SAMPLES).unwrap();
                assert!(samples.len().unwrap() >= 3, "45 KB in 16 KB chunks");
                samples.remove((seq, 1)).unwrap();
            }
            txn.commit().unwrap();
        }

        let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
        let err = store.read(0, 1).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("sample 1 has chunk 2"), "{err}");
    }

    /// A record's last chunk cut short, or one chunk too many: `read_records` (MessagePack pages)
    /// never hands either out; each is the decode error `read` (JSON pages) gives, naming the
    /// sample and the file.
    #[tokio::test]
    async fn a_record_cut_short_or_with_a_chunk_too_many_fails_both_reads() {
        let dir = tempfile::tempdir().unwrap();
        let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
        let big = store.append(&big_sample()).await.unwrap();
        let small = Sample {
            session_id: "small".into(),
            tokens: vec![1, 2, 3],
            ..Sample::default()
        };
        let other = store.append(&small).await.unwrap();
        let records = store.read_records(0, 10).await.unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(
            records[1].record(),
            ps_core::codec::encode_sample(&small).unwrap()
        );
        store.close().await.unwrap();

        let file = dir.path().join(DB_FILE_NAME);
        {
            let db = Database::create(&file).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut samples = txn.open_table(SAMPLES).unwrap();
                let last = samples
                    .range((big, 0)..(big, u32::MAX))
                    .unwrap()
                    .next_back()
                    .unwrap()
                    .unwrap()
                    .0
                    .value();
                let chunk = samples.get(last).unwrap().unwrap().value().to_vec();
                samples.insert(last, &chunk[..chunk.len() - 1]).unwrap();
                // The small sample gets a chunk it never had: two bytes after its record.
                samples.insert((other, 1), &[0xc0u8, 0x01][..]).unwrap();
            }
            txn.commit().unwrap();
        }

        let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
        let err = store.read_records(0, 10).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Decode { seq, .. } if seq == big),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(&format!("sample {big}")), "{message}");
        assert!(message.contains(&file.display().to_string()), "{message}");
        // The same error as a JSON page's read.
        assert_eq!(
            store.read(0, 10).await.unwrap_err().to_string(),
            message,
            "both encodings fail alike"
        );
        // The one with a chunk too many: the same, for both.
        let err = store.read_records(big, 10).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Decode { seq, .. } if seq == other),
            "{err:?}"
        );
        assert!(err.chain().contains("2 bytes after"), "{}", err.chain());
        assert_eq!(
            store.read(big, 10).await.unwrap_err().to_string(),
            err.to_string()
        );
    }

    #[tokio::test]
    async fn queued_requests_are_written_before_close_and_later_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SampleStore::open(StoreConfig::new(dir.path())).unwrap();
        let appends: Vec<_> = (0..20)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { store.append(&big_sample()).await })
            })
            .collect();
        // On this single-threaded runtime, yielding runs every append task up to waiting for
        // its answer, which is after its request was queued: the close is queued behind them.
        tokio::task::yield_now().await;
        let other = store.clone();
        store.close().await.unwrap();
        for append in appends {
            append.await.unwrap().unwrap();
        }
        assert_eq!(other.stats().last_seq, 20);
        assert!(matches!(
            other.append(&big_sample()).await,
            Err(StoreError::Closed { .. })
        ));
    }
}
