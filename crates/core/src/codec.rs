//! How both sample stores (the embedded redb store and the Redis stream) lay out a sample and a
//! pending turn: MessagePack with named fields (`rmp-serde`). One codec, so a sample reads the
//! same whichever store kept it.
//!
//! Why this format: `Sample.metadata` is a `serde_json::Map`, which only self-describing formats
//! can decode, so bincode and postcard are out. Between the self-describing ones, MessagePack
//! keeps `f64` as its 8 raw bytes (bit-exact, NaN and infinities included, no float printing or
//! parsing) and integers in 1 to 5 bytes, where JSON spends about 20 bytes of text per log-prob
//! and has to print and re-parse every one of them. A sample with 5,000 tokens is about 80 KB in
//! MessagePack against about 150 KB in JSON, and encodes several times faster, which matters at
//! the 2,000 samples/s target: the disk write and the encoding are the cost of an append.
//! Named fields (a map per struct, not an array) are required because `Sample` skips its absent
//! teacher fields (`skip_serializing_if`), which would shift positional fields.
//!
//! The stored bytes do not carry the sequence number: a sample is encoded before the store
//! assigns its seq, and decoding sets `index` and `group_index` from the seq it was stored under.
//! Each store wraps these errors in its own error enum, naming where the bytes live.

pub use rmp_serde::decode::Error as DecodeError;
pub use rmp_serde::encode::Error as EncodeError;

use rmp::Marker;

use crate::PendingTurn;
use crate::sample::Sample;

/// Encodes a sample for storage. Its `index` and `group_index` are ignored on decode.
pub fn encode_sample(sample: &Sample) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(sample)
}

/// Decodes the sample stored under `seq`, with `index` and `group_index` set to `seq`. Bytes
/// after the sample (a record longer than what the encoder wrote: a chunk too many) are an
/// error, not left unread.
pub fn decode_sample(seq: u64, bytes: &[u8]) -> Result<Sample, DecodeError> {
    use serde::Deserialize as _;
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(bytes));
    let mut sample = Sample::deserialize(&mut de)?;
    let read = usize::try_from(de.position()).unwrap_or(usize::MAX);
    if read != bytes.len() {
        return Err(DecodeError::Uncategorized(format!(
            "{} bytes after the sample's {read}: not a record the encoder wrote",
            bytes.len().saturating_sub(read)
        )));
    }
    sample.index = seq;
    sample.group_index = seq;
    Ok(sample)
}

/// Appends to `out` what `rmp_serde::encode::write_named` writes for
/// `StoredSample { seq, sample }`, where `sample` is `record` (the bytes of [`encode_sample`],
/// one whole MessagePack value: checked by [`crate::EncodedSample`]'s constructors) decoded under
/// `seq`: a trainer's MessagePack page is written from the stored records without decoding them.
/// The record is copied with the values of its first two entries, `index` and `group_index`,
/// replaced by `seq`: the same bytes as decoding it and encoding it again, because it is what the
/// same encoder wrote (a field a newer build added would be copied too, where decoding would drop
/// it). A record whose first entries are not those two is decoded and encoded again.
pub(crate) fn write_checked_record(
    out: &mut Vec<u8>,
    seq: u64,
    record: &[u8],
) -> Result<(), DecodeError> {
    let Some((map_header, rest)) = split_index_fields(record) else {
        return write_reencoded(out, seq, record);
    };
    write_entry_head(out, seq);
    // Writing into a Vec cannot fail: these calls' errors are the writer's.
    out.extend_from_slice(map_header);
    let _ = rmp::encode::write_str(out, "index");
    let _ = rmp::encode::write_uint(out, seq);
    let _ = rmp::encode::write_str(out, "group_index");
    let _ = rmp::encode::write_uint(out, seq);
    out.extend_from_slice(rest);
    Ok(())
}

/// `{"seq": seq, "sample": ` of a page's entry, the sample still to write.
fn write_entry_head(out: &mut Vec<u8>, seq: u64) {
    let _ = rmp::encode::write_map_len(out, 2);
    let _ = rmp::encode::write_str(out, "seq");
    let _ = rmp::encode::write_uint(out, seq);
    let _ = rmp::encode::write_str(out, "sample");
}

/// A page's entry for `record` decoded under `seq` and encoded again.
fn write_reencoded(out: &mut Vec<u8>, seq: u64, record: &[u8]) -> Result<(), DecodeError> {
    let sample = decode_sample(seq, record)?;
    write_entry_head(out, seq);
    rmp_serde::encode::write_named(out, &sample)
        .map_err(|e| DecodeError::Uncategorized(e.to_string()))
}

/// Whether a page copies `record` as it is ([`write_checked_record`]): a map whose first two
/// entries are `index` and `group_index` with unsigned values, and which is exactly one complete
/// MessagePack value with valid UTF-8 in every string (a record cut short, or with bytes after
/// it, is not). A store checks its records ([`crate::EncodedSample::from_record`]) where it can
/// name the file of one that fails; a record that is not is decoded and encoded again
/// ([`canonical_record`]).
pub fn is_spliceable(record: &[u8]) -> bool {
    split_index_fields(record).is_some() && value_len(record) == Some(record.len())
}

/// `record` if it [`is_spliceable`], else the sample it decodes to under `seq`, encoded again
/// (an error if it does not decode): what a page can be written from.
pub fn canonical_record(seq: u64, record: Vec<u8>) -> Result<Vec<u8>, DecodeError> {
    if is_spliceable(&record) {
        return Ok(record);
    }
    encode_sample(&decode_sample(seq, &record)?)
        .map_err(|e| DecodeError::Uncategorized(e.to_string()))
}

/// A record's map header and what follows its `index` and `group_index` entries (the keys as
/// the encoder writes them, each value an unsigned integer), or `None` for any other layout.
fn split_index_fields(record: &[u8]) -> Option<(&[u8], &[u8])> {
    let header_len = match Marker::from_u8(*record.first()?) {
        Marker::FixMap(_) => 1,
        Marker::Map16 => 3,
        Marker::Map32 => 5,
        _ => return None,
    };
    let (header, mut rest) = record.split_at_checked(header_len)?;
    for key in ["index", "group_index"] {
        // A fixstr (both keys are shorter than 32 bytes), then the value.
        let len = key.len();
        let (k, after) = rest.split_at_checked(1 + len)?;
        if k[0] != 0xa0 | len as u8 || &k[1..] != key.as_bytes() {
            return None;
        }
        let value_len = match Marker::from_u8(*after.first()?) {
            Marker::FixPos(_) => 1,
            Marker::U8 => 2,
            Marker::U16 => 3,
            Marker::U32 => 5,
            Marker::U64 => 9,
            _ => return None,
        };
        rest = after.get(value_len..)?;
    }
    Some((header, rest))
}

/// The whole length (marker included) of each MessagePack marker that is a value of fixed
/// size: integers, floats, nil, booleans, fixed-size extensions; 0 for the others (strings,
/// binaries, extensions and containers, which carry a length, and the reserved `0xc1`). Most of
/// a sample is runs of these (its token ids): the walk takes them in one table lookup each.
const FIXED_LEN: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0usize;
    while b < 256 {
        table[b] = match b as u8 {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 1,
            0xcc | 0xd0 => 2,
            0xcd | 0xd1 => 3,
            0xce | 0xd2 | 0xca => 5,
            0xcf | 0xd3 | 0xcb => 9,
            // fixext 1, 2, 4, 8, 16: marker, type, data.
            0xd4 => 3,
            0xd5 => 4,
            0xd6 => 6,
            0xd7 => 10,
            0xd8 => 18,
            _ => 0,
        };
        b += 1;
    }
    table
};

/// The length of the MessagePack value at the start of `bytes`, walking its markers without
/// building anything; `None` when it is cut short, uses the reserved marker or has a string that
/// is not UTF-8 (what a decode refuses too).
fn value_len(bytes: &[u8]) -> Option<usize> {
    let mut at = 0usize;
    // Values still to walk: one, and every element or key and value a container announces.
    let mut pending: usize = 1;
    while pending > 0 {
        pending -= 1;
        let b = *bytes.get(at)?;
        let fixed = FIXED_LEN[usize::from(b)];
        if fixed > 0 {
            at += usize::from(fixed);
            continue;
        }
        at += 1;
        let n = |at: &mut usize, width: usize| -> Option<usize> {
            let b = bytes.get(*at..*at + width)?;
            *at += width;
            Some(b.iter().fold(0usize, |acc, &x| (acc << 8) | usize::from(x)))
        };
        let (skip, text, items) = match Marker::from_u8(b) {
            Marker::FixStr(len) => (usize::from(len), true, 0),
            Marker::Str8 => (n(&mut at, 1)?, true, 0),
            Marker::Str16 => (n(&mut at, 2)?, true, 0),
            Marker::Str32 => (n(&mut at, 4)?, true, 0),
            Marker::Bin8 => (n(&mut at, 1)?, false, 0),
            Marker::Bin16 => (n(&mut at, 2)?, false, 0),
            Marker::Bin32 => (n(&mut at, 4)?, false, 0),
            // The length, then the type byte and the data.
            Marker::Ext8 => (n(&mut at, 1)?.checked_add(1)?, false, 0),
            Marker::Ext16 => (n(&mut at, 2)?.checked_add(1)?, false, 0),
            Marker::Ext32 => (n(&mut at, 4)?.checked_add(1)?, false, 0),
            Marker::FixArray(len) => (0, false, usize::from(len)),
            Marker::Array16 => (0, false, n(&mut at, 2)?),
            Marker::Array32 => (0, false, n(&mut at, 4)?),
            Marker::FixMap(len) => (0, false, 2 * usize::from(len)),
            Marker::Map16 => (0, false, n(&mut at, 2)?.checked_mul(2)?),
            Marker::Map32 => (0, false, n(&mut at, 4)?.checked_mul(2)?),
            // The reserved marker; the fixed-size ones were taken above.
            _ => return None,
        };
        let end = at.checked_add(skip)?;
        let body = bytes.get(at..end)?;
        if text {
            std::str::from_utf8(body).ok()?;
        }
        at = end;
        if items > 0 {
            pending = pending.checked_add(items)?;
            // Every value takes at least one byte: more announced than bytes left is cut short.
            if pending > bytes.len().saturating_sub(at) {
                return None;
            }
        }
    }
    // The last fixed-size value may end past the bytes.
    (at <= bytes.len()).then_some(at)
}

/// Encodes a turn persisted at shutdown.
pub fn encode_pending(turn: &PendingTurn) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(turn)
}

/// Decodes a turn persisted at shutdown.
pub fn decode_pending(bytes: &[u8]) -> Result<PendingTurn, DecodeError> {
    rmp_serde::from_slice(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn decode_takes_index_and_group_index_from_the_seq() {
        let sample = Sample {
            index: 77,
            group_index: 78,
            session_id: "s".into(),
            rollout_log_probs: vec![-0.0, f64::NEG_INFINITY],
            ..Sample::default()
        };
        let bytes = encode_sample(&sample).unwrap();
        let decoded = decode_sample(5, &bytes).unwrap();
        assert_eq!((decoded.index, decoded.group_index), (5, 5));
        assert_eq!(decoded.session_id, "s");
        assert_eq!(decoded.rollout_log_probs[0].to_bits(), (-0.0f64).to_bits());
        assert_eq!(decoded.rollout_log_probs[1], f64::NEG_INFINITY);
        assert_eq!(decoded.teacher_log_probs, None);
    }

    #[test]
    fn fields_are_named() {
        let bytes = encode_sample(&Sample::default()).unwrap();
        // A map with the field names, not a positional array.
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("session_id"), "{text}");
        assert!(text.contains("rollout_log_probs"), "{text}");
    }

    /// A pending turn's tokenizer fingerprint round-trips (all 64 bits), and a record written
    /// before the field existed reads as having none.
    #[test]
    fn a_pending_turns_fingerprint_round_trips_and_older_records_have_none() {
        let pending = PendingTurn {
            next: None,
            session_had_effective: true,
            tokenizer: Some(u64::MAX),
            ..crate::pending::testing::pending_turn("s", 2)
        };
        let back = decode_pending(&encode_pending(&pending).unwrap()).unwrap();
        assert_eq!(back, pending);
        // The same record without the key, as an older version wrote it.
        let mut old = serde_json::to_value(&pending).unwrap();
        old.as_object_mut().unwrap().remove("tokenizer");
        let back = decode_pending(&rmp_serde::to_vec_named(&old).unwrap()).unwrap();
        assert_eq!(back.tokenizer, None);
        assert_eq!(back.turn, pending.turn);
    }

    /// A page's entry for `record` stored under `seq`, as the rollout API writes it: checked
    /// ([`crate::EncodedSample::from_record`]), then written.
    fn write_stored_sample(out: &mut Vec<u8>, seq: u64, record: &[u8]) -> Result<(), DecodeError> {
        crate::EncodedSample::from_record(seq, record.to_vec())?.write_named(out)
    }

    /// Samples of every shape a record takes: teacher fields present or skipped, metadata,
    /// non-finite floats, an index set before storing.
    fn shapes() -> Vec<Sample> {
        let mut metadata = serde_json::Map::new();
        metadata.insert("excluded".into(), "score_zero".into());
        metadata.insert(
            "votes".into(),
            serde_json::json!([1, -1, 0, 2.5, null, {"k": "v"}]),
        );
        vec![
            Sample::default(),
            Sample {
                images: Vec::new(),
                rollout_routed_experts: None,
                index: 77,
                group_index: 78,
                prompt: "<|im_start|>user\nhi \"there\"<|im_end|>".into(),
                response: "ok".into(),
                tokens: vec![0, 1, 127, 128, 255, 256, 65_535, 65_536, u32::MAX],
                response_length: 2,
                loss_mask: vec![1, 0],
                rollout_log_probs: vec![-0.0, f64::NAN, f64::NEG_INFINITY, -1e-300],
                reward: crate::sample::Reward { score: -1.0 },
                status: crate::sample::SampleStatus::Completed,
                session_id: "s-1".into(),
                turn: 300,
                weight_versions: vec!["7".into()],
                teacher_log_probs: Some(vec![-0.5, -0.25]),
                teacher_topk_log_probs: Some(vec![vec![-0.1, -2.0], vec![]]),
                teacher_topk_indices: Some(vec![vec![5, 6], vec![]]),
                metadata,
            },
            Sample {
                index: u64::MAX,
                group_index: u64::MAX,
                tokens: (0..70_000).collect(),
                ..Sample::default()
            },
        ]
    }

    /// What a page holds for `(seq, record)`: the record decoded under `seq`, encoded again.
    fn reencoded(seq: u64, record: &[u8]) -> Vec<u8> {
        let sample = decode_sample(seq, record).unwrap();
        rmp_serde::to_vec_named(&crate::StoredSample { seq, sample }).unwrap()
    }

    /// Every width MessagePack gives an unsigned integer, for the seq and for the index the record
    /// was written with.
    const SEQS: [u64; 11] = [
        0,
        1,
        127,
        128,
        255,
        256,
        65_535,
        65_536,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        u64::MAX,
    ];

    #[test]
    fn a_spliced_record_is_byte_for_byte_the_decoded_sample_encoded_again() {
        for sample in shapes() {
            for index in SEQS {
                let record = encode_sample(&Sample {
                    index,
                    group_index: index,
                    ..sample.clone()
                })
                .unwrap();
                assert!(is_spliceable(&record), "the fast path is taken");
                assert_eq!(canonical_record(3, record.clone()).unwrap(), record);
                for seq in SEQS {
                    let mut out = Vec::new();
                    write_stored_sample(&mut out, seq, &record).unwrap();
                    assert_eq!(out, reencoded(seq, &record), "index {index}, seq {seq}");
                }
            }
        }
    }

    #[test]
    fn a_record_of_another_layout_is_decoded_and_encoded_again() {
        let sample = Sample {
            // JSON has no NaN or infinities.
            rollout_log_probs: vec![-0.5, -1e-300],
            ..shapes().swap_remove(1)
        };
        // The same fields in another order (a map written from a JSON tree, keys sorted), and a
        // map of more than 15 entries written with a 16-bit header: the first is not spliced, the
        // second is.
        let mut tree = serde_json::to_value(&sample).unwrap();
        tree.as_object_mut().unwrap().sort_keys();
        let sorted = rmp_serde::to_vec_named(&tree).unwrap();
        assert!(split_index_fields(&sorted).is_none());
        let mut out = b"before".to_vec();
        write_stored_sample(&mut out, 9, &sorted).unwrap();
        assert_eq!(&out[..6], b"before", "appends");
        assert_eq!(out[6..], reencoded(9, &sorted));
        let record = encode_sample(&sample).unwrap();
        assert_eq!(record[0], 0xde, "a map16 header (16 fields)");
        assert!(split_index_fields(&record).is_some());
    }

    #[test]
    fn a_record_that_does_not_decode_is_the_error() {
        let mut out = Vec::new();
        assert!(write_stored_sample(&mut out, 1, b"\xc1 not msgpack").is_err());
        let record = encode_sample(&shapes().swap_remove(1)).unwrap();
        // Cut anywhere, also after the two entries the splice rewrites: never copied.
        for cut in [8, 30, record.len() / 2, record.len() - 1] {
            let cut = &record[..cut];
            assert!(!is_spliceable(cut), "cut at {}", cut.len());
            assert!(write_stored_sample(&mut out, 1, cut).is_err());
            assert!(canonical_record(1, cut.to_vec()).is_err());
        }
        // A string that is not UTF-8 (the session id's last byte).
        let mut bad = record.clone();
        let at = bad.windows(3).rposition(|w| w == b"s-1").unwrap() + 2;
        bad[at] = 0xff;
        assert!(!is_spliceable(&bad));
        assert!(write_stored_sample(&mut out, 1, &bad).is_err());
        assert!(out.is_empty(), "nothing written for a failed record");
        // Nor is one made into a page's record.
        assert!(crate::EncodedSample::from_record(1, bad).is_err());
        assert!(crate::EncodedSample::from_record(1, record[..30].to_vec()).is_err());
    }

    /// Bytes after the record (a chunk too many) are neither copied into a page nor left unread
    /// by a decode: the record is refused, as one cut short is.
    #[test]
    fn bytes_after_a_record_are_an_error() {
        let record = encode_sample(&shapes().swap_remove(1)).unwrap();
        let mut longer = record.clone();
        longer.extend_from_slice(&[0xc0, 0x01]);
        assert!(!is_spliceable(&longer));
        let err = decode_sample(4, &longer).unwrap_err().to_string();
        assert!(err.contains("2 bytes after the sample's"), "{err}");
        let mut out = Vec::new();
        assert!(write_stored_sample(&mut out, 4, &longer).is_err());
        assert!(canonical_record(4, longer).is_err());
        assert!(out.is_empty());
    }

    /// The walk measures every kind of value: what `rmp_serde` writes for JSON trees, plus the
    /// markers it never writes for a sample (binary, extension, signed and narrow floats).
    #[test]
    fn the_walk_measures_every_kind_of_value_and_refuses_every_cut() {
        let mut odd = Vec::new();
        rmp::encode::write_array_len(&mut odd, 10 + 4 + 12 + 2).unwrap();
        rmp::encode::write_bin(&mut odd, &[1, 2, 3]).unwrap();
        rmp::encode::write_bin(&mut odd, &[7; 300]).unwrap();
        rmp::encode::write_ext_meta(&mut odd, 4, 5).unwrap();
        odd.extend_from_slice(&[1, 2, 3, 4]);
        rmp::encode::write_ext_meta(&mut odd, 3, 5).unwrap();
        odd.extend_from_slice(&[9, 9, 9]);
        rmp::encode::write_ext_meta(&mut odd, 300, 5).unwrap();
        odd.extend_from_slice(&[0; 300]);
        rmp::encode::write_ext_meta(&mut odd, 70_000, 5).unwrap();
        odd.extend(std::iter::repeat_n(0u8, 70_000));
        rmp::encode::write_i64(&mut odd, -5_000_000_000).unwrap();
        rmp::encode::write_f32(&mut odd, 1.5).unwrap();
        rmp::encode::write_sint(&mut odd, -20).unwrap();
        rmp::encode::write_str(&mut odd, &"é".repeat(40_000)).unwrap();
        // The fixed-size markers the others did not write.
        for len in [1u32, 2, 8, 16] {
            rmp::encode::write_ext_meta(&mut odd, len, 1).unwrap();
            odd.extend(std::iter::repeat_n(7u8, len as usize));
        }
        rmp::encode::write_i8(&mut odd, -100).unwrap();
        rmp::encode::write_i16(&mut odd, -1000).unwrap();
        rmp::encode::write_i32(&mut odd, -100_000).unwrap();
        rmp::encode::write_u8(&mut odd, 1).unwrap();
        rmp::encode::write_u16(&mut odd, 1).unwrap();
        rmp::encode::write_u32(&mut odd, 1).unwrap();
        rmp::encode::write_u64(&mut odd, 1).unwrap();
        rmp::encode::write_f64(&mut odd, -0.0).unwrap();
        rmp::encode::write_bool(&mut odd, true).unwrap();
        rmp::encode::write_nil(&mut odd).unwrap();
        rmp::encode::write_pfix(&mut odd, 5).unwrap();
        rmp::encode::write_nfix(&mut odd, -5).unwrap();
        rmp::encode::write_bin_len(&mut odd, 70_000).unwrap();
        odd.extend(std::iter::repeat_n(0u8, 70_000));
        rmp::encode::write_map_len(&mut odd, 70_000).unwrap();
        for k in 0..70_000u32 {
            rmp::encode::write_uint(&mut odd, u64::from(k)).unwrap();
            rmp::encode::write_nil(&mut odd).unwrap();
        }
        let trees = [
            serde_json::json!(null),
            serde_json::json!({}),
            serde_json::json!([]),
            serde_json::json!({"a": [1, -1, 300, -300, 70000, -70000, 5e9, -5e9, 1.5, true, false, null],
                               "b": {"c": "x".repeat(300), "d": "y".repeat(70_000)}, "e": [[], {}, [[]]]}),
        ];
        let mut cases: Vec<Vec<u8>> = trees
            .iter()
            .map(|t| rmp_serde::to_vec_named(t).unwrap())
            .collect();
        cases.push(odd);
        cases.extend(shapes().iter().map(|s| encode_sample(s).unwrap()));
        for bytes in &cases {
            assert_eq!(value_len(bytes), Some(bytes.len()));
            let mut more = bytes.clone();
            more.push(0xc0);
            assert_eq!(value_len(&more), Some(bytes.len()));
            // Every cut of the small ones; a spread of cuts of the large ones.
            let step = (bytes.len() / 500).max(1);
            for cut in (0..bytes.len()).step_by(step) {
                assert_eq!(
                    value_len(&bytes[..cut]),
                    None,
                    "cut at {cut} of {}",
                    bytes.len()
                );
            }
        }
        assert_eq!(value_len(&[0xc1]), None, "the reserved marker");
        // An array announcing more elements than there are bytes.
        assert_eq!(value_len(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]), None);
    }

    #[test]
    fn garbage_is_a_decode_error() {
        assert!(decode_sample(9, b"\xc1 not msgpack").is_err());
        assert!(decode_pending(b"\xc1").is_err());
    }
}
