//! The teacher signal belongs to our tokens only when the ids the teacher scored are our response ids.

/// The drop reason callers count and record when [`check_alignment`] fails.
pub const TEACHER_TOKEN_MISMATCH: &str = "teacher_token_mismatch";

/// Where the teacher's ids first differ from our response ids. Typically the teacher's tokenizer
/// differs from the policy's, or the teacher input was tokenized as one text and BPE merged across the
/// prompt/response boundary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "teacher token mismatch at response position {first_position}: ours {}, the teacher's {} \
     ({len_ours} response tokens, {len_theirs} scored)",
    id_text(.ours),
    id_text(.theirs)
)]
pub struct Mismatch {
    /// 0-based response position of the first difference (the shorter length when one sequence is a
    /// prefix of the other).
    pub first_position: usize,
    /// Our id there; `None` when our response is the shorter one.
    pub ours: Option<u32>,
    /// The teacher's id there; `None` when the teacher's sequence is the shorter one.
    pub theirs: Option<u32>,
    pub len_ours: usize,
    pub len_theirs: usize,
}

impl Mismatch {
    /// The stable drop reason, [`TEACHER_TOKEN_MISMATCH`].
    pub fn reason(&self) -> &'static str {
        TEACHER_TOKEN_MISMATCH
    }
}

fn id_text(id: &Option<u32>) -> String {
    id.map_or_else(|| "(none)".to_owned(), |id| id.to_string())
}

/// `Ok` when `echoed` (the ids the teacher scored) equals `response_ids` exactly; otherwise the first
/// difference. Nothing is padded or truncated: callers use the teacher signal only on `Ok` and drop the
/// sample with reason [`TEACHER_TOKEN_MISMATCH`] otherwise.
pub fn check_alignment(response_ids: &[u32], echoed: &[u32]) -> Result<(), Mismatch> {
    let first = response_ids
        .iter()
        .zip(echoed)
        .position(|(a, b)| a != b)
        .or_else(|| {
            (response_ids.len() != echoed.len()).then(|| response_ids.len().min(echoed.len()))
        });
    match first {
        None => Ok(()),
        Some(i) => Err(Mismatch {
            first_position: i,
            ours: response_ids.get(i).copied(),
            theirs: echoed.get(i).copied(),
            len_ours: response_ids.len(),
            len_theirs: echoed.len(),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn equal_ids_align() {
        assert_eq!(check_alignment(&[1, 2, 3], &[1, 2, 3]), Ok(()));
        assert_eq!(check_alignment(&[], &[]), Ok(()));
    }

    #[test]
    fn the_first_difference_is_reported() {
        let m = check_alignment(&[1, 2, 3, 4], &[1, 2, 9, 4]).unwrap_err();
        assert_eq!(
            m,
            Mismatch {
                first_position: 2,
                ours: Some(3),
                theirs: Some(9),
                len_ours: 4,
                len_theirs: 4,
            }
        );
        let text = m.to_string();
        assert!(
            text.contains("position 2") && text.contains("ours 3"),
            "{text}"
        );
        assert_eq!(m.reason(), "teacher_token_mismatch");
    }

    #[test]
    fn length_differences_are_mismatches() {
        let shorter_teacher = check_alignment(&[1, 2, 3], &[1, 2]).unwrap_err();
        assert_eq!(shorter_teacher.first_position, 2);
        assert_eq!(shorter_teacher.ours, Some(3));
        assert_eq!(shorter_teacher.theirs, None);
        let longer_teacher = check_alignment(&[1, 2], &[1, 2, 3]).unwrap_err();
        assert_eq!(longer_teacher.first_position, 2);
        assert_eq!(longer_teacher.ours, None);
        assert_eq!(longer_teacher.theirs, Some(3));
        assert!(longer_teacher.to_string().contains("(none)"));
        // A difference before the end wins over the length difference.
        assert_eq!(
            check_alignment(&[5, 2], &[1, 2, 3])
                .unwrap_err()
                .first_position,
            0
        );
    }
}
