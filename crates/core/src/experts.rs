//! Routed experts of a mixture-of-experts policy (routing replay): what the engine returned
//! ([`EngineExperts`]), a captured turn's compact copy ([`ExpertRows`]), and a sample's
//! ([`SampleExperts`], Slime's `rollout_routed_experts`) held as content-addressed blocks so that
//! the positions a conversation's turns share are stored once.
//!
//! Rows follow the engines and Slime: one row per token of `tokens` but the last (whose routing
//! never ran), each `layers × top_k` expert indices, row-major.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Rows per block of a sample's experts. A later turn of a conversation repeats the earlier
/// turns' positions in its prompt: every block that lies wholly within them is the same content
/// and is stored once. 256 rows of a 48-layer top-8 model in one byte each are 96 KiB.
pub const BLOCK_ROWS: usize = 256;

/// The integer width experts are held in: the smallest that holds every index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertWidth {
    Uint8,
    Uint16,
    Int32,
}

impl ExpertWidth {
    /// Bytes per index.
    pub fn bytes(self) -> usize {
        match self {
            Self::Uint8 => 1,
            Self::Uint16 => 2,
            Self::Int32 => 4,
        }
    }

    /// The smallest width that holds indices up to `max`.
    pub fn for_max(max: u32) -> Self {
        if max <= u32::from(u8::MAX) {
            Self::Uint8
        } else if max <= u32::from(u16::MAX) {
            Self::Uint16
        } else {
            Self::Int32
        }
    }

    /// The NumPy dtype name (`uint8`, `uint16`, `int32`).
    pub fn numpy(self) -> &'static str {
        match self {
            Self::Uint8 => "uint8",
            Self::Uint16 => "uint16",
            Self::Int32 => "int32",
        }
    }

    /// Index `i` of little-endian `data` in this width (a negative int32, or an `i` past the
    /// data, reads as `None`).
    pub fn read(self, data: &[u8], i: usize) -> Option<u32> {
        let b = self.bytes();
        let s = data.get(i * b..(i + 1) * b)?;
        match self {
            Self::Uint8 => Some(u32::from(s[0])),
            Self::Uint16 => Some(u32::from(u16::from_le_bytes([s[0], s[1]]))),
            Self::Int32 => u32::try_from(i32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok(),
        }
    }
}

/// The routed experts an engine returned with an answer, decoded from their base64: little-endian
/// indices in `width`. `shape` is `[rows, layers, top_k]` when the engine states it (vLLM's `.npy`);
/// SGLang's flat int32 bytes state none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineExperts {
    pub width: ExpertWidth,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<[usize; 3]>,
    /// Where they were read (`sglext.routed_experts`, `choices[0].routed_experts`).
    pub field: String,
}

impl EngineExperts {
    /// How many indices the data holds.
    pub fn len(&self) -> usize {
        self.data.len() / self.width.bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// A model's routing shape: layers that report experts and experts per token (its `config.json`'s
/// `num_hidden_layers` and `num_experts_per_tok`), and how many experts there are when it says
/// (`num_experts`, `n_routed_experts`, `num_local_experts`): the width every turn is stored in,
/// so that all turns of a conversation share their blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeShape {
    pub layers: usize,
    pub top_k: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<usize>,
}

/// A captured turn's routed experts: `rows × layers × top_k` indices in the smallest width that
/// holds them, little-endian, row-major (`rows` = the turn's tokens − 1).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExpertRows {
    pub rows: usize,
    pub layers: usize,
    pub top_k: usize,
    pub width: ExpertWidth,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    /// The SHA-256 (hex) of each block of [`BLOCK_ROWS`] rows of `data`, computed where the rows
    /// were checked (the capture thread), so that making the sample only copies bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_hashes: Vec<String>,
    /// Its bytes counted against the memory bound of held experts while it lives
    /// ([`ExpertBudget`]); never serialized (a turn resumed after a restart is not counted).
    #[serde(skip)]
    pub held: Option<Held>,
}

/// Equal rows, whether or not counted in a budget.
impl PartialEq for ExpertRows {
    fn eq(&self, other: &Self) -> bool {
        (self.rows, self.layers, self.top_k, self.width, &self.data)
            == (
                other.rows,
                other.layers,
                other.top_k,
                other.width,
                &other.data,
            )
    }
}

/// A bound on the bytes of routed experts that captured turns hold in memory while they wait for
/// their next state and their judges (`capture.max_held_experts_mib`): a turn past it keeps no
/// experts. Clones share the count.
#[derive(Debug, Clone, Default)]
pub struct ExpertBudget(Arc<BudgetCount>);

#[derive(Debug, Default)]
struct BudgetCount {
    limit: std::sync::atomic::AtomicUsize,
    held: std::sync::atomic::AtomicUsize,
}

impl ExpertBudget {
    /// A bound of `limit` bytes (0: none).
    pub fn new(limit: usize) -> Self {
        let b = Self::default();
        b.set_limit(limit);
        b
    }

    pub fn set_limit(&self, limit: usize) {
        self.0
            .limit
            .store(limit, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn limit(&self) -> usize {
        self.0.limit.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.0.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts `bytes` whether or not they fit (memory already held: a turn resumed after a
    /// restart); the returned [`Held`] gives them back when dropped.
    pub fn hold(&self, bytes: usize) -> Held {
        self.0
            .held
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        Held {
            budget: self.clone(),
            bytes,
        }
    }

    /// Counts `bytes` if they fit under the bound; the returned [`Held`] gives them back when
    /// dropped. `None`: they do not fit.
    pub fn reserve(&self, bytes: usize) -> Option<Held> {
        use std::sync::atomic::Ordering::Relaxed;
        let limit = self.limit();
        self.0
            .held
            .fetch_update(Relaxed, Relaxed, |h| {
                let next = h.checked_add(bytes)?;
                (limit == 0 || next <= limit).then_some(next)
            })
            .ok()?;
        Some(Held {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes counted in an [`ExpertBudget`] while this lives. A clone counts again (past the bound
/// too: the memory is held either way).
#[derive(Debug)]
pub struct Held {
    budget: ExpertBudget,
    bytes: usize,
}

impl Clone for Held {
    fn clone(&self) -> Self {
        self.budget
            .0
            .held
            .fetch_add(self.bytes, std::sync::atomic::Ordering::Relaxed);
        Self {
            budget: self.budget.clone(),
            bytes: self.bytes,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget
            .0
            .held
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What is held is not part of a turn's value.
impl PartialEq for Held {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Why an engine's experts do not fit a turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpertsMismatch {
    #[error(
        "the engine returned {got} routed-expert indices ({field}), which is not {rows} rows (the \
         turn's {tokens} tokens − 1) of whole rows"
    )]
    Rows {
        got: usize,
        rows: usize,
        tokens: usize,
        field: String,
    },
    #[error(
        "the engine's routed experts ({field}) have shape {shape:?}, not {rows} rows (the turn's \
         {tokens} tokens − 1)"
    )]
    Shape {
        shape: [usize; 3],
        rows: usize,
        tokens: usize,
        field: String,
    },
    #[error(
        "the engine's routed experts ({field}) have {per_row} indices per row, which the model's \
         {layers} layers × top-{top_k} do not make"
    )]
    Layers {
        per_row: usize,
        layers: usize,
        top_k: usize,
        field: String,
    },
    #[error(
        "the engine's routed experts ({field}) have {per_row} indices per row and no shape, and \
         the model's layers and top-k are unknown: put the model's config.json \
         (num_hidden_layers, num_experts_per_tok) in its directory (server.model_dir)"
    )]
    NoShape { per_row: usize, field: String },
    #[error("the engine's routed experts ({field}) hold a negative index")]
    Negative { field: String },
}

impl ExpertRows {
    /// The engine's experts of a turn of `tokens` tokens, checked against its shape (rows =
    /// `tokens − 1`; layers × top-k from the engine's own shape, else `model`'s, else refused:
    /// [`ExpertsMismatch::NoShape`]) and narrowed to the smallest width.
    pub fn of_turn(
        engine: &EngineExperts,
        tokens: usize,
        model: Option<MoeShape>,
    ) -> Result<Self, ExpertsMismatch> {
        let rows = tokens.saturating_sub(1);
        let n = engine.len();
        let (layers, top_k) = match engine.shape {
            Some(shape) => {
                let total = shape[0]
                    .checked_mul(shape[1])
                    .and_then(|x| x.checked_mul(shape[2]));
                if shape[0] != rows || total != Some(n) {
                    return Err(ExpertsMismatch::Shape {
                        shape,
                        rows,
                        tokens,
                        field: engine.field.clone(),
                    });
                }
                (shape[1], shape[2])
            }
            None => {
                if rows == 0 || n == 0 || !n.is_multiple_of(rows) {
                    return Err(ExpertsMismatch::Rows {
                        got: n,
                        rows,
                        tokens,
                        field: engine.field.clone(),
                    });
                }
                let per_row = n / rows;
                match model {
                    Some(m) if m.layers * m.top_k == per_row => (m.layers, m.top_k),
                    Some(m) => {
                        return Err(ExpertsMismatch::Layers {
                            per_row,
                            layers: m.layers,
                            top_k: m.top_k,
                            field: engine.field.clone(),
                        });
                    }
                    None => {
                        return Err(ExpertsMismatch::NoShape {
                            per_row,
                            field: engine.field.clone(),
                        });
                    }
                }
            }
        };
        let mut max = 0u32;
        for i in 0..n {
            let v =
                engine
                    .width
                    .read(&engine.data, i)
                    .ok_or_else(|| ExpertsMismatch::Negative {
                        field: engine.field.clone(),
                    })?;
            max = max.max(v);
        }
        // The model's expert count decides when known: every turn in one width.
        let most = model
            .and_then(|m| m.experts)
            .and_then(|e| u32::try_from(e.saturating_sub(1)).ok())
            .unwrap_or(0);
        let width = ExpertWidth::for_max(max.max(most));
        let data = if width == engine.width {
            engine.data.clone()
        } else {
            let mut out = Vec::with_capacity(n * width.bytes());
            for i in 0..n {
                let v = engine.width.read(&engine.data, i).unwrap_or(0);
                match width {
                    ExpertWidth::Uint8 => out.push(v as u8),
                    ExpertWidth::Uint16 => out.extend_from_slice(&(v as u16).to_le_bytes()),
                    ExpertWidth::Int32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
                }
            }
            out
        };
        let mut rows = Self {
            rows,
            layers,
            top_k,
            width,
            data,
            block_hashes: Vec::new(),
            held: None,
        };
        rows.block_hashes = rows.blocks().map(|b| hex(&Sha256::digest(b))).collect();
        Ok(rows)
    }

    /// `data` cut into blocks of [`BLOCK_ROWS`] rows (the last may be shorter).
    fn blocks(&self) -> std::slice::Chunks<'_, u8> {
        let row_bytes = self.layers * self.top_k * self.width.bytes();
        self.data.chunks((row_bytes * BLOCK_ROWS).max(1))
    }

    /// Every index, as int32 (Slime's dtype).
    pub fn to_i32(&self) -> Vec<i32> {
        (0..self.data.len() / self.width.bytes())
            .map(|i| self.width.read(&self.data, i).unwrap_or(0) as i32)
            .collect()
    }
}

/// A sample's routed experts (Slime's `rollout_routed_experts`, by reference): `shape` is
/// `[rows, layers, top_k]` (rows = `tokens` − 1), `dtype` the width of the bytes, and `blocks`
/// the content hashes (SHA-256, hex) of consecutive runs of [`BLOCK_ROWS`] rows (the last may be
/// shorter), whose bytes the store keeps once per hash and delivers beside the sample, as images.
/// `start_len` is Slime's `routed_experts_start_len`: 0, the rows cover the whole sample.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleExperts {
    pub shape: [usize; 3],
    pub dtype: ExpertWidth,
    pub start_len: usize,
    pub block_rows: usize,
    pub blocks: Vec<ExpertBlock>,
    /// While the sample's blocks hold their bytes (until it is stored), they count in the
    /// budget its turn's rows counted in; never serialized.
    #[serde(skip)]
    pub held: Option<Held>,
}

/// Equal experts, whether or not counted in a budget.
impl PartialEq for SampleExperts {
    fn eq(&self, other: &Self) -> bool {
        (
            self.shape,
            self.dtype,
            self.start_len,
            self.block_rows,
            &self.blocks,
        ) == (
            other.shape,
            other.dtype,
            other.start_len,
            other.block_rows,
            &other.blocks,
        )
    }
}

/// One block of a sample's experts: its hash and, while the sample travels to its store, its
/// bytes (never serialized with the sample).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExpertBlock {
    pub hash: String,
    #[serde(skip)]
    pub bytes: Option<Arc<[u8]>>,
}

impl SampleExperts {
    /// Splits `rows` into blocks of [`BLOCK_ROWS`] rows, each hashed.
    /// The hashes are the rows' own when they carry them (computed on the capture thread).
    pub fn of(rows: &ExpertRows) -> Self {
        let known = rows.block_hashes.len() == rows.blocks().len();
        let blocks = rows
            .blocks()
            .enumerate()
            .map(|(i, chunk)| ExpertBlock {
                hash: if known {
                    rows.block_hashes[i].clone()
                } else {
                    hex(&Sha256::digest(chunk))
                },
                bytes: Some(Arc::from(chunk)),
            })
            .collect();
        Self {
            shape: [rows.rows, rows.layers, rows.top_k],
            dtype: rows.width,
            start_len: 0,
            block_rows: BLOCK_ROWS,
            blocks,
            held: rows.held.clone(),
        }
    }

    /// The bytes every block's hash names, joined: `None` when a block is missing or the total
    /// is not the shape's.
    pub fn assemble(&self, mut block: impl FnMut(&str) -> Option<Arc<[u8]>>) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for b in &self.blocks {
            out.extend_from_slice(&b.bytes.clone().or_else(|| block(&b.hash))?);
        }
        let want = self.shape.iter().product::<usize>() * self.dtype.bytes();
        (out.len() == want).then_some(out)
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Bytes as one base64 string in JSON, as bytes in MessagePack (the stores' codec of pending
/// turns); either is read back.
mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
        } else {
            s.serialize_bytes(bytes)
        }
    }

    struct Visitor;

    impl serde::de::Visitor<'_> for Visitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes, or a base64 string")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
            base64::engine::general_purpose::STANDARD
                .decode(v)
                .map_err(E::custom)
        }

        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            d.deserialize_str(Visitor)
        } else {
            d.deserialize_bytes(Visitor)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn int32(values: &[i32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn sglang(values: &[i32]) -> EngineExperts {
        EngineExperts {
            width: ExpertWidth::Int32,
            data: int32(values),
            shape: None,
            field: "sglext.routed_experts".into(),
        }
    }

    #[test]
    fn flat_int32_is_narrowed_and_shaped_by_the_model() {
        // 3 tokens → 2 rows of 2 layers × top-2.
        let values = [0, 7, 3, 1, 200, 2, 5, 9];
        let model = Some(MoeShape {
            layers: 2,
            top_k: 2,
            experts: None,
        });
        let rows = ExpertRows::of_turn(&sglang(&values), 3, model).unwrap();
        assert_eq!((rows.rows, rows.layers, rows.top_k), (2, 2, 2));
        assert_eq!(rows.width, ExpertWidth::Uint8);
        assert_eq!(rows.data.len(), 8);
        assert_eq!(rows.to_i32(), values);
        let one = Some(MoeShape {
            layers: 1,
            top_k: 1,
            experts: None,
        });
        let wide = ExpertRows::of_turn(&sglang(&[300, 1]), 3, one).unwrap();
        assert_eq!(wide.width, ExpertWidth::Uint16);
        assert_eq!(wide.to_i32(), [300, 1]);
        // Flat values without the model's shape are not guessed at.
        assert!(matches!(
            ExpertRows::of_turn(&sglang(&[300, 1]), 3, None),
            Err(ExpertsMismatch::NoShape { per_row: 1, .. })
        ));
    }

    #[test]
    fn shapes_that_do_not_fit_the_turn_are_refused() {
        let model = Some(MoeShape {
            layers: 2,
            top_k: 2,
            experts: None,
        });
        // 7 indices are not whole rows of 2.
        assert!(matches!(
            ExpertRows::of_turn(&sglang(&[1; 7]), 3, model),
            Err(ExpertsMismatch::Rows { .. })
        ));
        // 2 rows of 3 do not make 2 × 2.
        assert!(matches!(
            ExpertRows::of_turn(&sglang(&[1; 6]), 3, model),
            Err(ExpertsMismatch::Layers { .. })
        ));
        assert!(matches!(
            ExpertRows::of_turn(&sglang(&[1, -1, 2, 3]), 2, model),
            Err(ExpertsMismatch::Negative { .. })
        ));
        let huge = EngineExperts {
            width: ExpertWidth::Uint8,
            data: vec![1; 4],
            shape: Some([3, usize::MAX, 2]),
            field: "x".into(),
        };
        assert!(matches!(
            ExpertRows::of_turn(&huge, 4, None),
            Err(ExpertsMismatch::Shape { .. })
        ));
        let shaped = EngineExperts {
            width: ExpertWidth::Uint8,
            data: vec![1; 12],
            shape: Some([3, 2, 2]),
            field: "choices[0].routed_experts".into(),
        };
        assert!(matches!(
            ExpertRows::of_turn(&shaped, 3, None),
            Err(ExpertsMismatch::Shape { .. })
        ));
        let rows = ExpertRows::of_turn(&shaped, 4, None).unwrap();
        assert_eq!((rows.rows, rows.layers, rows.top_k), (3, 2, 2));
    }

    #[test]
    fn a_longer_conversation_shares_the_blocks_of_its_prefix() {
        let model = MoeShape {
            layers: 1,
            top_k: 2,
            experts: None,
        };
        let values: Vec<i32> = (0..2 * 700).map(|i| i * 7 % 13).collect();
        let short = ExpertRows::of_turn(&sglang(&values[..2 * 600]), 601, Some(model)).unwrap();
        let long = ExpertRows::of_turn(&sglang(&values), 701, Some(model)).unwrap();
        let (a, b) = (SampleExperts::of(&short), SampleExperts::of(&long));
        // The hashes computed with the rows are the blocks' own.
        let mut bare_rows = long.clone();
        bare_rows.block_hashes.clear();
        assert_eq!(SampleExperts::of(&bare_rows), b);
        assert_eq!(long.block_hashes.len(), 3);
        assert_eq!(a.blocks.len(), 3);
        assert_eq!(b.blocks.len(), 3);
        // The two full blocks are the same content; the partial last ones differ.
        assert_eq!(a.blocks[..2], b.blocks[..2]);
        assert_ne!(a.blocks[2].hash, b.blocks[2].hash);
        let joined = b.assemble(|_| None).unwrap();
        assert_eq!(joined, long.data);
        // Without its bytes a block is looked up by hash; a missing one fails.
        let mut bare = b.clone();
        bare.blocks.iter_mut().for_each(|x| x.bytes = None);
        assert!(bare.assemble(|_| None).is_none());
        let kept: std::collections::HashMap<String, Arc<[u8]>> = b
            .blocks
            .iter()
            .map(|x| (x.hash.clone(), x.bytes.clone().unwrap()))
            .collect();
        assert_eq!(bare.assemble(|h| kept.get(h).cloned()).unwrap(), long.data);
        // Serialized: hashes only.
        let json = serde_json::to_value(&bare).unwrap();
        assert_eq!(json["blocks"][0], serde_json::json!(b.blocks[0].hash));
        assert_eq!(json["shape"], serde_json::json!([700, 1, 2]));
        assert_eq!(json["dtype"], "uint8");
    }

    #[test]
    fn rows_round_trip_as_base64_in_json_and_as_bytes_in_messagepack() {
        let rows = ExpertRows {
            rows: 1,
            layers: 1,
            top_k: 3,
            width: ExpertWidth::Uint8,
            data: vec![0, 255, 7],
            block_hashes: Vec::new(),
            held: None,
        };
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json["data"], "AP8H");
        assert_eq!(serde_json::from_value::<ExpertRows>(json).unwrap(), rows);
        let packed = rmp_serde::to_vec_named(&rows).unwrap();
        assert!(packed.windows(3).any(|w| w == [0, 255, 7]), "raw bytes");
        assert_eq!(rmp_serde::from_slice::<ExpertRows>(&packed).unwrap(), rows);
        // A record with the base64 string in MessagePack is read too.
        let as_text = rmp_serde::to_vec_named(&serde_json::to_value(&rows).unwrap()).unwrap();
        assert_eq!(rmp_serde::from_slice::<ExpertRows>(&as_text).unwrap(), rows);
    }

    #[test]
    fn the_models_expert_count_sets_the_width_of_every_turn() {
        let model = Some(MoeShape {
            layers: 1,
            top_k: 1,
            experts: Some(300),
        });
        // Indices below 256, but a 300-expert model: uint16, as every other turn of it.
        let rows = ExpertRows::of_turn(&sglang(&[3, 7]), 3, model).unwrap();
        assert_eq!(rows.width, ExpertWidth::Uint16);
        assert_eq!(rows.to_i32(), [3, 7]);
    }

    #[test]
    fn a_samples_copy_counts_until_it_is_dropped_and_a_resumed_turn_counts_past_the_bound() {
        let budget = ExpertBudget::new(10);
        let mut rows = ExpertRows::of_turn(
            &EngineExperts {
                width: ExpertWidth::Int32,
                data: [1i32, 2, 3, 4]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                shape: Some([2, 1, 2]),
                field: "x".into(),
            },
            3,
            None,
        )
        .unwrap();
        rows.held = budget.reserve(rows.data.len());
        let sample = SampleExperts::of(&rows);
        assert_eq!(budget.held(), 8);
        drop(rows);
        assert_eq!(
            budget.held(),
            4,
            "the sample's blocks still hold their bytes"
        );
        drop(sample);
        assert_eq!(budget.held(), 0);
        let resumed = budget.hold(50);
        assert_eq!(budget.held(), 50);
        assert!(budget.reserve(1).is_none());
        drop(resumed);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn the_budget_counts_what_lives_and_refuses_past_its_bound() {
        let budget = ExpertBudget::new(100);
        let a = budget.reserve(60).unwrap();
        assert!(budget.reserve(50).is_none(), "past the bound");
        let b = a.clone();
        assert_eq!(budget.held(), 120, "a clone holds its bytes too");
        drop(a);
        drop(b);
        assert_eq!(budget.held(), 0);
        let c = budget.reserve(100).unwrap();
        assert_eq!(budget.held(), 100);
        drop(c);
        assert!(
            ExpertBudget::new(0).reserve(usize::MAX / 2).is_some(),
            "0: no bound"
        );
    }
}
