//! A stored sample as the page shows it: one entry per response token with its mask, both
//! log-probs, the OPD advantage, the teacher's top-K and why the position stands out.

use std::collections::HashSet;

use ps_core::StoredSample;
use serde_json::Value;

use crate::TokenText;
use crate::api::{SampleView, TokenView, TopEntry};

fn positions(v: Option<&Value>) -> HashSet<usize> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|p| p as usize)
                .collect()
        })
        .unwrap_or_default()
}

fn text_of(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_owned)
}

/// Builds the view of `stored`; `tokens` gives each token's text when the server has the
/// tokenizer.
pub fn sample_view(stored: &StoredSample, tokens: Option<&dyn TokenText>) -> SampleView {
    let s = &stored.sample;
    let m = &s.metadata;
    let n = s.response_length.min(s.tokens.len());
    let prompt_len = s.tokens.len() - n;
    let response = &s.tokens[prompt_len..];
    let missing = positions(m.get("logprob_missing_positions"));
    let trained_without = positions(m.get("trained_without_rollout_logprob"));
    let masked_without = positions(m.get("masked_without_logprob"));
    let sources: Vec<&str> = m
        .get("logprob_sources")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_str().unwrap_or("sampled")).collect())
        .unwrap_or_default();
    let teacher = s.teacher_log_probs.as_deref();
    let text = |id: u32| tokens.and_then(|t| t.text(id));
    let views = response
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let lp = if missing.contains(&i) {
                None
            } else {
                s.rollout_log_probs.get(i).copied()
            };
            let teacher_lp = teacher.and_then(|t| t.get(i).copied());
            let source = sources.get(i).copied().unwrap_or("sampled");
            let mut marks = Vec::new();
            if lp.is_none() {
                marks.push("no_logprob".to_owned());
            }
            match source {
                "unsampled" => marks.push("template_inserted".to_owned()),
                "eos_unreported" => marks.push("eos_unreported".to_owned()),
                _ => {}
            }
            if trained_without.contains(&i) {
                marks.push("trained_without_logprob".to_owned());
            }
            if masked_without.contains(&i) {
                marks.push("masked_without_logprob".to_owned());
            }
            let top = match (&s.teacher_topk_indices, &s.teacher_topk_log_probs) {
                (Some(ids), Some(lps)) => ids
                    .get(i)
                    .zip(lps.get(i))
                    .map(|(ids, lps)| {
                        ids.iter()
                            .zip(lps)
                            .map(|(&id, &lp)| TopEntry {
                                id,
                                text: text(id),
                                lp,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            TokenView {
                id,
                text: text(id),
                mask: s.loss_mask.get(i).copied().unwrap_or(0),
                lp,
                teacher_lp,
                adv: teacher_lp.zip(lp).map(|(t, r)| t - r),
                source: source.to_owned(),
                marks,
                top,
                experts: None,
            }
        })
        .collect();
    SampleView {
        seq: stored.seq,
        session_id: s.session_id.clone(),
        turn: s.turn,
        mode: text_of(m.get("mode")),
        reward: s.reward.score,
        status: serde_json::to_value(s.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        trains: s.loss_mask.iter().any(|&b| b != 0),
        excluded: text_of(m.get("excluded")),
        votes: m
            .get("votes")
            .or_else(|| m.get("eval_votes"))
            .filter(|v| !v.is_null())
            .cloned(),
        hint: text_of(m.get("hint")),
        hint_votes: m.get("hint_votes").filter(|v| !v.is_null()).cloned(),
        teacher: text_of(m.get("teacher")),
        prompt: s.prompt.clone(),
        prompt_tokens: prompt_len,
        response_tokens: n,
        images: s.images.clone(),
        has_teacher: teacher.is_some(),
        tokens: views,
        metadata: m.clone(),
    }
}

/// Puts each response token's routed experts into `view` from the sample's experts `e` and their
/// bytes (its blocks joined): row `r` is the routing of token `r` of `tokens`.
pub fn attach_experts(view: &mut SampleView, e: &ps_core::SampleExperts, bytes: &[u8]) {
    let [rows, layers, top_k] = e.shape;
    let width = e.dtype.bytes();
    let row_bytes = layers * top_k * width;
    if bytes.len() != rows * row_bytes || layers * top_k == 0 {
        return;
    }
    for (i, t) in view.tokens.iter_mut().enumerate() {
        let r = view.prompt_tokens + i;
        let Some(row) = bytes.get(r * row_bytes..(r + 1) * row_bytes) else {
            continue;
        };
        t.experts = Some(
            row.chunks(top_k * width)
                .map(|layer| {
                    (0..top_k)
                        .map(|k| e.dtype.read(layer, k).unwrap_or(u32::MAX))
                        .collect()
                })
                .collect(),
        );
    }
}

#[cfg(test)]
mod tests {
    use ps_core::sample::{Reward, Sample};
    use serde_json::json;

    use super::*;

    struct Letters;
    impl TokenText for Letters {
        fn text(&self, id: u32) -> Option<String> {
            Some(format!("<t{id}>"))
        }
    }

    #[test]
    fn tokens_carry_mask_logprobs_advantage_marks_and_top_k() {
        let mut metadata = serde_json::Map::new();
        metadata.insert("mode".into(), json!("opd"));
        metadata.insert("logprob_missing_positions".into(), json!([2]));
        metadata.insert(
            "logprob_sources".into(),
            json!(["sampled", "sampled", "unsampled"]),
        );
        metadata.insert("hint".into(), json!("check the units"));
        metadata.insert("hint_votes".into(), json!([1, -1]));
        metadata.insert("votes".into(), Value::Null);
        let stored = StoredSample {
            seq: 7,
            sample: Sample {
                prompt: "p".into(),
                tokens: vec![1, 2, 10, 11, 12],
                response_length: 3,
                loss_mask: vec![1, 1, 0],
                rollout_log_probs: vec![-0.5, -2.0, 0.0],
                reward: Reward { score: 1.0 },
                session_id: "s".into(),
                turn: 3,
                teacher_log_probs: Some(vec![-0.25, -3.0, -1.0]),
                teacher_topk_indices: Some(vec![vec![10, 99], vec![], vec![]]),
                teacher_topk_log_probs: Some(vec![vec![-0.25, -2.0], vec![], vec![]]),
                metadata,
                ..Sample::default()
            },
        };
        let v = sample_view(&stored, Some(&Letters));
        assert_eq!(
            (v.seq, v.turn, v.prompt_tokens, v.response_tokens),
            (7, 3, 2, 3)
        );
        assert_eq!(v.mode.as_deref(), Some("opd"));
        assert_eq!(v.hint.as_deref(), Some("check the units"));
        assert_eq!(v.votes, None);
        assert!(v.trains && v.has_teacher);
        let t = &v.tokens;
        assert_eq!(t[0].text.as_deref(), Some("<t10>"));
        assert_eq!(
            (t[0].lp, t[0].teacher_lp, t[0].adv),
            (Some(-0.5), Some(-0.25), Some(0.25))
        );
        assert_eq!(
            t[0].top[1],
            TopEntry {
                id: 99,
                text: Some("<t99>".into()),
                lp: -2.0
            }
        );
        assert!(t[1].marks.is_empty());
        // The placeholder 0.0 is not shown as a log-prob.
        assert_eq!((t[2].lp, t[2].adv, t[2].mask), (None, None, 0));
        assert_eq!(t[2].marks, vec!["no_logprob", "template_inserted"]);
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["tokens"][2]["lp"], Value::Null);
        assert_eq!(json["tokens"][1].get("top"), None);
    }

    #[test]
    fn a_sample_shorter_than_its_response_length_does_not_panic() {
        let stored = StoredSample {
            seq: 1,
            sample: Sample {
                tokens: vec![5],
                response_length: 4,
                ..Sample::default()
            },
        };
        let v = sample_view(&stored, None);
        assert_eq!((v.prompt_tokens, v.tokens.len()), (0, 1));
        assert_eq!(v.tokens[0].mask, 0);
        assert_eq!(v.tokens[0].lp, None);
    }

    #[test]
    fn each_response_token_gets_its_row_of_experts_but_the_last() {
        let stored = StoredSample {
            seq: 1,
            sample: Sample {
                tokens: vec![1, 2, 10, 11],
                response_length: 2,
                loss_mask: vec![1, 1],
                rollout_log_probs: vec![-0.1, -0.2],
                ..Sample::default()
            },
        };
        let mut v = sample_view(&stored, None);
        // 3 rows (tokens − 1) of 2 layers × top-1.
        let rows = ps_core::ExpertRows::of_turn(
            &ps_core::EngineExperts {
                width: ps_core::ExpertWidth::Int32,
                data: [1i32, 2, 3, 4, 5, 6]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                shape: Some([3, 2, 1]),
                field: "test".into(),
            },
            4,
            None,
        )
        .unwrap();
        let e = ps_core::SampleExperts::of(&rows);
        attach_experts(&mut v, &e, &rows.data);
        assert_eq!(v.tokens[0].experts, Some(vec![vec![5], vec![6]]));
        assert_eq!(v.tokens[1].experts, None, "the last token was never routed");
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["tokens"][0]["experts"], json!([[5], [6]]));
        // Bytes of another length (a block missing) leave the view without experts.
        let mut w = sample_view(&stored, None);
        attach_experts(&mut w, &e, &rows.data[1..]);
        assert!(w.tokens.iter().all(|t| t.experts.is_none()));
    }
}
