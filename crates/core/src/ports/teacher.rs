//! The teacher's port: log-probs of **given** tokens ([`TeacherScorer`] → [`TeacherLogprobs`]),
//! and the check that the tokens the teacher scored are our response's ([`check_alignment`]). A
//! teacher signal is used only when they are: nothing is padded or filled in.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::CallError;

/// The drop reason of a turn whose prompt holds images when the teacher cannot score images.
pub const TEACHER_WITHOUT_IMAGES: &str = "teacher_without_images";

/// The teacher's view of the last `T` tokens of an input (`T` = the `response_len` asked for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherLogprobs {
    /// `[T]`: the teacher's log-prob of each response token. Every entry is a value the teacher sent
    /// (vLLM's `-9999.0` clamp of `-inf` is passed through as is).
    pub log_probs: Vec<f64>,
    /// `[T][K]` when K > 0, best first.
    pub topk_log_probs: Option<Vec<Vec<f64>>>,
    /// `[T][K]` when K > 0, the token ids of [`Self::topk_log_probs`].
    pub topk_indices: Option<Vec<Vec<u32>>>,
    /// `[T]`: the token ids the teacher says it scored at those positions. Use only when they equal the
    /// response ids ([`Self::check_alignment`]).
    pub echoed_ids: Vec<u32>,
    /// Whether [`Self::echoed_ids`] came from the teacher. `false` when a completions server does not
    /// echo `prompt_token_ids` (older vLLM builds): the ids are then the ones we sent.
    pub echo_verified: bool,
    /// The temperature the teacher was asked to score at (`opd.teacher_temperature`; 0 as the
    /// reference).
    #[serde(default)]
    pub temperature: f64,
    /// `opd.teacher_temperature = "rollout"` and the turn's request left the temperature to the
    /// engine: [`Self::temperature`] is the assumed 1.0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub temperature_assumed: bool,
}

/// `opd.teacher_temperature`: the temperature the teacher is asked to score at. Neither SGLang nor
/// vLLM applies a temperature to prompt log-probs (docs/upstream-protocols.md section 9): a value
/// other than 0 reaches the teacher's request and is recorded, and only a teacher patched to scale
/// its log-probs changes its answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TeacherTemperature {
    /// A fixed temperature (0: the reference's greedy scoring, the default).
    Fixed(f64),
    /// Each turn's own rollout temperature (Slime's #2085); 1.0, marked as assumed, when the
    /// turn's request left it to the engine.
    Rollout,
}

impl Default for TeacherTemperature {
    fn default() -> Self {
        Self::Fixed(0.0)
    }
}

impl TeacherTemperature {
    /// The temperature for a turn sampled with `sampling`, and whether it was assumed.
    pub fn for_turn(self, sampling: &crate::Sampling) -> (f64, bool) {
        match self {
            Self::Fixed(t) => (t, false),
            Self::Rollout => sampling.temperature.map_or((1.0, true), |t| (t, false)),
        }
    }
}

impl Serialize for TeacherTemperature {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Fixed(t) => s.serialize_f64(*t),
            Self::Rollout => s.serialize_str("rollout"),
        }
    }
}

impl<'de> Deserialize<'de> for TeacherTemperature {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TeacherTemperature;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a temperature of at least 0, or \"rollout\"")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                if v.is_finite() && v >= 0.0 {
                    Ok(TeacherTemperature::Fixed(v))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                self.visit_f64(v as f64)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "rollout" => Ok(TeacherTemperature::Rollout),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl TeacherLogprobs {
    /// The result for `T = 0` (no call is made).
    pub fn empty(top_k: usize) -> Self {
        Self {
            log_probs: Vec::new(),
            topk_log_probs: (top_k > 0).then(Vec::new),
            topk_indices: (top_k > 0).then(Vec::new),
            echoed_ids: Vec::new(),
            echo_verified: true,
            temperature: 0.0,
            temperature_assumed: false,
        }
    }

    /// [`check_alignment`] of `response_ids` against [`Self::echoed_ids`].
    pub fn check_alignment(&self, response_ids: &[u32]) -> Result<(), Mismatch> {
        check_alignment(response_ids, &self.echoed_ids)
    }
}

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

#[cfg_attr(any(test, feature = "test-support"), mockall::automock)]
#[async_trait]
pub trait TeacherScorer: Send + Sync {
    /// The teacher's log-probs of the last `response_len` (`T`) tokens of `input_ids` (`L` tokens: the
    /// hinted prompt, then the original response), and with `top_k` (`K`) > 0 its top-K per position.
    /// `T = 0` gives an empty result without a call; `T >= L` is [`a no-context error`] (the first
    /// input token has no log-prob). One call, bounded by the configured timeout.
    async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, CallError>;

    /// A short description for logs, such as `sglang /generate at http://…` (never the key).
    fn describe(&self) -> String;

    /// [`Self::score`] (or [`Self::score_with_images`] when `image_data` is not empty) with the
    /// teacher asked to score at `temperature` (`opd.teacher_temperature`). By default only 0 is
    /// taken; another temperature is an error, never ignored.
    async fn score_at(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
        temperature: f64,
    ) -> Result<TeacherLogprobs, CallError> {
        if temperature != 0.0 {
            return Err(CallError::new(
                "teacher_error",
                format!(
                    "the teacher ({}) cannot be asked for a temperature ({temperature}): set \
                     opd.teacher_temperature = 0",
                    self.describe()
                ),
            ));
        }
        if image_data.is_empty() {
            self.score(input_ids, response_len, top_k).await
        } else {
            self.score_with_images(input_ids, response_len, top_k, image_data)
                .await
        }
    }

    /// Whether [`Self::score_with_images`] can score an input whose prompt holds images. By
    /// default not: such a turn gets no teacher values (`teacher_without_images`).
    fn takes_images(&self) -> bool {
        false
    }

    /// [`Self::score`] of an input whose prompt holds images: `input_ids` hold each image's run of
    /// pad tokens, `image_data` the images in prompt order, as data URLs. By default an error
    /// (reason [`TEACHER_WITHOUT_IMAGES`]).
    async fn score_with_images(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
    ) -> Result<TeacherLogprobs, CallError> {
        let _ = (input_ids, response_len, top_k, image_data);
        Err(CallError::new(
            TEACHER_WITHOUT_IMAGES,
            format!(
                "the teacher ({}) scores token ids only, not a prompt with images (use an SGLang \
                 teacher, `teacher.backend = \"sglang\"`, which takes image_data)",
                self.describe()
            ),
        ))
    }
}

#[async_trait]
impl<S: TeacherScorer + ?Sized> TeacherScorer for std::sync::Arc<S> {
    async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, CallError> {
        (**self).score(input_ids, response_len, top_k).await
    }

    fn describe(&self) -> String {
        (**self).describe()
    }

    async fn score_at(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
        temperature: f64,
    ) -> Result<TeacherLogprobs, CallError> {
        (**self)
            .score_at(input_ids, response_len, top_k, image_data, temperature)
            .await
    }

    fn takes_images(&self) -> bool {
        (**self).takes_images()
    }

    async fn score_with_images(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
    ) -> Result<TeacherLogprobs, CallError> {
        (**self)
            .score_with_images(input_ids, response_len, top_k, image_data)
            .await
    }
}
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_teacher_temperature_of_a_turn() {
        let sent = |t| crate::Sampling {
            temperature: t,
            ..Default::default()
        };
        assert_eq!(
            TeacherTemperature::default().for_turn(&sent(Some(0.7))),
            (0.0, false)
        );
        assert_eq!(
            TeacherTemperature::Fixed(0.3).for_turn(&sent(Some(0.7))),
            (0.3, false)
        );
        assert_eq!(
            TeacherTemperature::Rollout.for_turn(&sent(Some(0.7))),
            (0.7, false)
        );
        assert_eq!(
            TeacherTemperature::Rollout.for_turn(&sent(None)),
            (1.0, true)
        );
        for (text, want) in [
            ("0", TeacherTemperature::Fixed(0.0)),
            ("0.5", TeacherTemperature::Fixed(0.5)),
            ("\"rollout\"", TeacherTemperature::Rollout),
        ] {
            let t: TeacherTemperature = serde_json::from_str(text).unwrap();
            assert_eq!(t, want);
            assert_eq!(
                serde_json::to_string(&t).unwrap().trim_end_matches(".0"),
                text
            );
        }
        for bad in ["-1", "\"hot\"", "null"] {
            assert!(
                serde_json::from_str::<TeacherTemperature>(bad).is_err(),
                "{bad}"
            );
        }
    }

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
