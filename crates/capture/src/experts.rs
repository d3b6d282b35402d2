//! A captured turn's routed experts (`capture.routed_experts`): the engine's, checked against the
//! turn's tokens (rows = tokens − 1; layers × top-k from the engine's shape or the model's
//! `config.json`) and narrowed ([`attach`]); what was counted ([`ExpertStats`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use ps_core::{
    CapturedTurn, ExpertRows, MoeShape, RolloutResponse, RoutedExpertsMode, TokenSource,
};
use serde_json::json;

use crate::CaptureError;

/// What capture knows and counted of routed experts.
#[derive(Debug, Default)]
pub struct ExpertStats {
    mode: AtomicU8,
    shape: Mutex<Option<MoeShape>>,
    /// Main turns ask the engine for experts: a turn without them is missing from the first.
    asked: std::sync::atomic::AtomicBool,
    /// Turns captured with their experts.
    pub captured: AtomicU64,
    /// Turns without experts after an engine returned some (`auto`), or refused for it
    /// (`require`).
    pub missing: AtomicU64,
    /// Turns whose experts did not fit their tokens or could not be read.
    pub mismatched: AtomicU64,
    /// Turns whose experts did not fit under `capture.max_held_experts_mib`.
    pub over_budget: AtomicU64,
    /// The bytes of experts captured turns hold now, and their bound.
    pub budget: ps_core::ExpertBudget,
    /// The first mismatch, for the status.
    last: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ExpertStats {
    /// `capture.routed_experts`, and the model's routing shape when its `config.json` states it
    /// (needed for SGLang's flat experts; vLLM's carry their shape).
    pub fn configure(&self, mode: RoutedExpertsMode, shape: Option<MoeShape>, asked: bool) {
        self.asked.store(asked, Ordering::Relaxed);
        let m = match mode {
            RoutedExpertsMode::Auto => 0,
            RoutedExpertsMode::Off => 1,
            RoutedExpertsMode::Require => 2,
        };
        self.mode.store(m, Ordering::Relaxed);
        *lock(&self.shape) = shape;
    }

    pub fn mode(&self) -> RoutedExpertsMode {
        match self.mode.load(Ordering::Relaxed) {
            1 => RoutedExpertsMode::Off,
            2 => RoutedExpertsMode::Require,
            _ => RoutedExpertsMode::Auto,
        }
    }

    pub fn shape(&self) -> Option<MoeShape> {
        *lock(&self.shape)
    }

    /// `/v1/rollout/status`'s `routed_experts` section.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "mode": self.mode().as_str(),
            "model_shape": self.shape(),
            "captured": self.captured.load(Ordering::Relaxed),
            "missing": self.missing.load(Ordering::Relaxed),
            "mismatched": self.mismatched.load(Ordering::Relaxed),
            "over_budget": self.over_budget.load(Ordering::Relaxed),
            "held_bytes": self.budget.held(),
            "max_held_bytes": self.budget.limit(),
            "last_mismatch": lock(&self.last).clone(),
        })
    }
}

/// Attaches the engine's experts to `turn`. Under `require` a turn without them, or whose
/// experts do not fit its tokens, is refused with its reason (`routed_experts_missing`,
/// `routed_experts_mismatch`); under `auto` it keeps no experts and is counted, and its sample says
/// why (`metadata.routed_experts_missing`).
/// Returns the reason a turn kept under `auto` has none, to be logged once.
pub(crate) fn attach(
    turn: &mut CapturedTurn,
    rollout: &RolloutResponse,
    stats: &ExpertStats,
) -> Result<Option<&'static str>, CaptureError> {
    let mode = stats.mode();
    if mode == RoutedExpertsMode::Off {
        return Ok(None);
    }
    let tokens = turn.prompt_ids.len() + turn.response_ids.len();
    let shaped = |engine: &ps_core::EngineExperts| {
        ExpertRows::of_turn(engine, tokens, stats.shape())
            .map_err(|e| ("routed_experts_mismatch", e.to_string()))
    };
    let present = rollout.routed_experts.is_some() || rollout.routed_experts_encoded.is_some();
    let found = if present && turn.token_source != TokenSource::Engine {
        // Rows are the engine's tokens: only a turn whose ids are the engine's has them one for
        // one (a re-rendered response holds template tokens the engine never routed, and may
        // hold as many tokens by chance).
        Err((
            "routed_experts_mismatch",
            "the turn's ids are re-tokenized, not the engine's: the engine's rows of routed \
             experts cannot be matched to them (ask the engine for its ids: sglang.token_ids, \
             or SGLang's --return-output-ids for streams)"
                .to_owned(),
        ))
    } else if let Some(engine) = &rollout.routed_experts {
        shaped(engine)
    } else if let Some(text) = &rollout.routed_experts_encoded {
        // A stream's experts arrive as SGLang's base64 text, decoded here, off the chat path.
        ps_sglang_client::experts::decode_sglang(text)
            .map_err(|e| ("routed_experts_mismatch", e))
            .and_then(|engine| shaped(&engine))
    } else if let Some(e) = &rollout.routed_experts_error {
        Err(("routed_experts_mismatch", e.clone()))
    } else {
        Err((
            "routed_experts_missing",
            "the engine returned no routed experts with the answer (SGLang: started without \
             --enable-return-routed-experts, or a build without them on this endpoint; vLLM: \
             started without it, or a streamed answer, which carries none)"
                .to_owned(),
        ))
    };
    match found {
        Ok(mut rows) => match stats.budget.reserve(rows.data.len()) {
            Some(held) => {
                rows.held = Some(held);
                stats.captured.fetch_add(1, Ordering::Relaxed);
                turn.routed_experts = Some(rows);
                Ok(None)
            }
            None => {
                stats.over_budget.fetch_add(1, Ordering::Relaxed);
                let detail = format!(
                    "the turn's {} bytes of routed experts would pass capture.max_held_experts_mib \
                     ({} bytes held by turns waiting to become samples): raise it, or judge faster",
                    rows.data.len(),
                    stats.budget.held()
                );
                if mode == RoutedExpertsMode::Require {
                    return Err(CaptureError::Refused {
                        reason: "routed_experts_over_budget",
                        detail,
                    });
                }
                turn.routed_experts_missing = Some("routed_experts_over_budget".to_owned());
                Ok(Some("routed_experts_over_budget"))
            }
        },
        Err((reason, detail)) => {
            let seen_before = stats.asked.load(Ordering::Relaxed)
                || stats.captured.load(Ordering::Relaxed) > 0
                || stats.mismatched.load(Ordering::Relaxed) > 0;
            if reason == "routed_experts_mismatch" {
                stats.mismatched.fetch_add(1, Ordering::Relaxed);
                lock(&stats.last).get_or_insert_with(|| detail.clone());
            } else if mode == RoutedExpertsMode::Require || seen_before {
                stats.missing.fetch_add(1, Ordering::Relaxed);
            } else {
                // `auto` and no engine has returned experts yet: a dense model, or an engine
                // that does not return them. Nothing to say.
                return Ok(None);
            }
            if mode == RoutedExpertsMode::Require {
                return Err(CaptureError::Refused { reason, detail });
            }
            turn.routed_experts_missing = Some(reason.to_owned());
            Ok(Some(reason))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use base64::Engine as _;
    use ps_core::{EngineExperts, ExpertWidth, TokenSource};

    use super::*;

    /// A 3-token turn (2 rows) and its engine's experts, 1 layer × top-2 each.
    fn turn(source: TokenSource) -> CapturedTurn {
        let mut t = ps_core::pending::testing::pending_turn("s", 1).turn;
        t.token_source = source;
        t
    }

    fn rollout(experts: Option<&[i32]>, encoded: bool) -> RolloutResponse {
        let data: Option<Vec<u8>> =
            experts.map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect());
        let mut r = RolloutResponse::default();
        match (data, encoded) {
            (Some(d), true) => {
                r.routed_experts_encoded =
                    Some(base64::engine::general_purpose::STANDARD.encode(d));
            }
            (Some(d), false) => {
                r.routed_experts = Some(EngineExperts {
                    width: ExpertWidth::Int32,
                    data: d,
                    shape: None,
                    field: "sglext.routed_experts".into(),
                });
            }
            (None, _) => {}
        }
        r
    }

    fn stats(mode: RoutedExpertsMode, asked: bool) -> ExpertStats {
        let s = ExpertStats::default();
        s.configure(
            mode,
            Some(MoeShape {
                layers: 1,
                top_k: 2,
                experts: None,
            }),
            asked,
        );
        s
    }

    #[test]
    fn every_mode_and_case() {
        let fit: &[i32] = &[1, 2, 3, 4];
        // Encoded (a stream) or decoded (whole): kept on an engine-id turn.
        for encoded in [false, true] {
            let s = stats(RoutedExpertsMode::Auto, false);
            let mut t = turn(TokenSource::Engine);
            assert_eq!(
                attach(&mut t, &rollout(Some(fit), encoded), &s).unwrap(),
                None
            );
            assert_eq!(t.routed_experts.unwrap().to_i32(), fit);
            assert_eq!(s.captured.load(Ordering::Relaxed), 1);
        }
        // A re-tokenized turn never keeps them, even when the count fits.
        let s = stats(RoutedExpertsMode::Auto, false);
        let mut t = turn(TokenSource::Retokenized);
        let why = attach(&mut t, &rollout(Some(fit), true), &s).unwrap();
        assert_eq!(why, Some("routed_experts_mismatch"));
        assert!(t.routed_experts.is_none());
        assert_eq!(
            t.routed_experts_missing.as_deref(),
            Some("routed_experts_mismatch")
        );
        assert_eq!(s.mismatched.load(Ordering::Relaxed), 1);
        // None at all: silent under `auto` until experts were seen or asked for...
        let s = stats(RoutedExpertsMode::Auto, false);
        let mut t = turn(TokenSource::Engine);
        assert_eq!(attach(&mut t, &rollout(None, false), &s).unwrap(), None);
        assert_eq!(s.missing.load(Ordering::Relaxed), 0);
        let s = stats(RoutedExpertsMode::Auto, true);
        assert_eq!(
            attach(&mut t, &rollout(None, false), &s).unwrap(),
            Some("routed_experts_missing")
        );
        assert_eq!(s.missing.load(Ordering::Relaxed), 1);
        // ...refused under `require`, with its reason; nothing under `off`.
        let s = stats(RoutedExpertsMode::Require, true);
        let mut t = turn(TokenSource::Engine);
        let e = attach(&mut t, &rollout(None, false), &s).unwrap_err();
        assert_eq!(e.reason(), "routed_experts_missing");
        let e = attach(&mut t, &rollout(Some(&[1, 2, 3]), false), &s).unwrap_err();
        assert_eq!(e.reason(), "routed_experts_mismatch");
        assert!(t.routed_experts_missing.is_none(), "marked only under auto");
        let s = stats(RoutedExpertsMode::Off, true);
        assert_eq!(
            attach(&mut t, &rollout(Some(fit), false), &s).unwrap(),
            None
        );
        assert!(t.routed_experts.is_none());
        assert_eq!(s.captured.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_held_bound_keeps_no_experts_past_it_and_frees_with_the_turn() {
        let fit: &[i32] = &[1, 2, 3, 4];
        let s = stats(RoutedExpertsMode::Auto, true);
        // 4 one-byte indices a turn; room for two turns.
        s.budget.set_limit(8);
        let (mut a, mut b, mut c) = (
            turn(TokenSource::Engine),
            turn(TokenSource::Engine),
            turn(TokenSource::Engine),
        );
        attach(&mut a, &rollout(Some(fit), false), &s).unwrap();
        attach(&mut b, &rollout(Some(fit), false), &s).unwrap();
        assert_eq!(s.budget.held(), 8);
        let why = attach(&mut c, &rollout(Some(fit), false), &s).unwrap();
        assert_eq!(why, Some("routed_experts_over_budget"));
        assert!(c.routed_experts.is_none());
        assert_eq!(s.over_budget.load(Ordering::Relaxed), 1);
        // A turn that became a sample (dropped) gives its bytes back.
        drop(a);
        assert_eq!(s.budget.held(), 4);
        let r = stats(RoutedExpertsMode::Require, true);
        r.budget.set_limit(3);
        let e = attach(&mut c, &rollout(Some(fit), false), &r).unwrap_err();
        assert_eq!(e.reason(), "routed_experts_over_budget");
        assert!(
            e.to_string().contains("capture.max_held_experts_mib"),
            "{e}"
        );
        drop(b);
        assert_eq!(s.budget.held(), 0);
    }
}
