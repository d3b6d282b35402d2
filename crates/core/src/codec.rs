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

use crate::PendingTurn;
use crate::sample::Sample;

/// Encodes a sample for storage. Its `index` and `group_index` are ignored on decode.
pub fn encode_sample(sample: &Sample) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(sample)
}

/// Decodes the sample stored under `seq`, with `index` and `group_index` set to `seq`.
pub fn decode_sample(seq: u64, bytes: &[u8]) -> Result<Sample, DecodeError> {
    let mut sample: Sample = rmp_serde::from_slice(bytes)?;
    sample.index = seq;
    sample.group_index = seq;
    Ok(sample)
}

/// Appends to `out` what `rmp_serde::encode::write_named` writes for
/// `StoredSample { seq, sample }`, where `sample` is `record` (the bytes of [`encode_sample`])
/// decoded under `seq`: a trainer's MessagePack page is written from the stored records without
/// decoding them. The record's first two fields are `index` and `group_index`, as [`Sample`]
/// declares them, so only their values are replaced by `seq`, and the rest of the record is
/// copied as it is: the same bytes as decoding it and encoding it again, because the record is
/// what the same encoder wrote. A record of another layout is decoded and encoded again; one that
/// does not decode is the error.
pub fn write_stored_sample(out: &mut Vec<u8>, seq: u64, record: &[u8]) -> Result<(), DecodeError> {
    use rmp::encode::{write_map_len, write_str, write_uint};
    // Writing into a Vec cannot fail: these calls' errors are the writer's.
    let head = |out: &mut Vec<u8>| {
        let _ = write_map_len(out, 2);
        let _ = write_str(out, "seq");
        let _ = write_uint(out, seq);
        let _ = write_str(out, "sample");
    };
    if let Some((map_header, rest)) = split_index_fields(record) {
        head(out);
        out.extend_from_slice(map_header);
        let _ = write_str(out, "index");
        let _ = write_uint(out, seq);
        let _ = write_str(out, "group_index");
        let _ = write_uint(out, seq);
        out.extend_from_slice(rest);
        return Ok(());
    }
    let sample = decode_sample(seq, record)?;
    head(out);
    rmp_serde::encode::write_named(out, &sample)
        .map_err(|e| DecodeError::Uncategorized(e.to_string()))
}

/// A record's map header and what follows its `index` and `group_index` entries (the keys as
/// the encoder writes them, each value an unsigned integer), or `None` for any other layout.
fn split_index_fields(record: &[u8]) -> Option<(&[u8], &[u8])> {
    let header_len = match *record.first()? {
        0x80..=0x8f => 1,
        0xde => 3,
        0xdf => 5,
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
        let value_len = match *after.first()? {
            0x00..=0x7f => 1,
            0xcc => 2,
            0xcd => 3,
            0xce => 5,
            0xcf => 9,
            _ => return None,
        };
        rest = after.get(value_len..)?;
    }
    Some((header, rest))
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
                assert!(
                    split_index_fields(&record).is_some(),
                    "the fast path is taken"
                );
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
        let record = encode_sample(&Sample::default()).unwrap();
        // Cut inside the index value: no splice of half a record.
        let mut cut = record.clone();
        cut.truncate(8);
        assert!(write_stored_sample(&mut out, 1, &cut).is_err());
    }

    #[test]
    fn garbage_is_a_decode_error() {
        assert!(decode_sample(9, b"\xc1 not msgpack").is_err());
        assert!(decode_pending(b"\xc1").is_err());
    }
}
