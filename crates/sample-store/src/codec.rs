//! How a sample is laid out on disk: MessagePack with named fields (`rmp-serde`).
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
//! The stored bytes do not carry the sequence number: a sample is encoded before the writer
//! assigns its seq, and decoding sets `index` and `group_index` from the key it was stored under.

use std::path::Path;

use ps_core::sample::Sample;

use crate::StoreError;

/// Encodes a sample for storage. Its `index` and `group_index` are ignored on decode.
pub(crate) fn encode(sample: &Sample) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(sample).map_err(|source| StoreError::Encode {
        session_id: sample.session_id.clone(),
        turn: sample.turn,
        source,
    })
}

/// Decodes the sample stored under `seq`, with `index` and `group_index` set to `seq`.
pub(crate) fn decode(seq: u64, bytes: &[u8], path: &Path) -> Result<Sample, StoreError> {
    let mut sample: Sample = rmp_serde::from_slice(bytes).map_err(|source| StoreError::Decode {
        seq,
        path: path.to_path_buf(),
        source,
    })?;
    sample.index = seq;
    sample.group_index = seq;
    Ok(sample)
}

#[cfg(test)]
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
        let bytes = encode(&sample).unwrap();
        let decoded = decode(5, &bytes, Path::new("x")).unwrap();
        assert_eq!((decoded.index, decoded.group_index), (5, 5));
        assert_eq!(decoded.session_id, "s");
        assert_eq!(decoded.rollout_log_probs[0].to_bits(), (-0.0f64).to_bits());
        assert_eq!(decoded.teacher_log_probs, None);
    }

    #[test]
    fn a_decode_error_names_the_seq_and_the_file() {
        let err = decode(9, b"\xc1 not msgpack", Path::new("/data/samples.redb")).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("sample 9"), "{message}");
        assert!(message.contains("/data/samples.redb"), "{message}");
    }
}
