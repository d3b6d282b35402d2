//! The sample store's use of the one sample codec ([`ps_core::codec`], shared with the Redis
//! store): its errors become [`StoreError`]s that name the sample or the file.

use std::path::Path;

use ps_core::codec;
use ps_core::sample::Sample;
use ps_core::{EncodedSample, StoredSample};

use crate::StoreError;

/// Encodes a sample for storage. Its `index` and `group_index` are ignored on decode.
pub(crate) fn encode(sample: &Sample) -> Result<Vec<u8>, StoreError> {
    codec::encode_sample(sample).map_err(|source| StoreError::Encode {
        session_id: sample.session_id.clone(),
        turn: sample.turn,
        source,
    })
}

/// Decodes the sample stored under `seq`, with `index` and `group_index` set to `seq`.
pub(crate) fn decode(seq: u64, bytes: &[u8], path: &Path) -> Result<Sample, StoreError> {
    codec::decode_sample(seq, bytes).map_err(|source| StoreError::Decode {
        seq,
        path: path.to_path_buf(),
        source,
    })
}

/// The sample stored under `seq` as `read` hands it out: decoded ([`decode`]).
pub(crate) fn decoded(seq: u64, record: Vec<u8>, path: &Path) -> Result<StoredSample, StoreError> {
    Ok(StoredSample {
        seq,
        sample: decode(seq, &record, path)?,
    })
}

/// The record stored under `seq`, checked, as a page is written from it: as stored when it is one
/// whole record of this encoder, else decoded and encoded again ([`EncodedSample::from_record`]);
/// a record that does not decode is the error, naming the seq and the file.
pub(crate) fn checked(seq: u64, record: Vec<u8>, path: &Path) -> Result<EncodedSample, StoreError> {
    EncodedSample::from_record(seq, record).map_err(|source| StoreError::Decode {
        seq,
        path: path.to_path_buf(),
        source,
    })
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
