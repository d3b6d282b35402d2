#![allow(clippy::unwrap_used, clippy::expect_used)]

#[tokio::test]
async fn the_demo_runs_end_to_end_and_the_trainer_side_gets_every_main_turn() {
    let mut out = Vec::new();
    let report = ps_demo::run(&mut out, ps_config::Mode::Rl).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("tokenizer    : the embedded mini-vl model (source: embedded demo)"),
        "{text}"
    );
    assert_eq!(report.replies.len(), 4);
    // The picture's conversation: one turn, its image captured exactly (one run of pads as long
    // as the image's count, the image referenced by its hash).
    let (first, picture): (Vec<_>, Vec<_>) = report
        .samples
        .iter()
        .partition(|s| s.sample.session_id == "demo-session-1");
    assert_eq!(picture.len(), 1);
    let p = &picture[0].sample;
    assert_eq!(p.images.len(), 1);
    assert_eq!((p.images[0].width, p.images[0].height), (64, 48));
    let pad = ps_chat_template::ChatTokenizer::mini_vl()
        .vision()
        .unwrap()
        .image_pad_id;
    assert_eq!(
        p.tokens.iter().filter(|&&t| t == pad).count(),
        p.images[0].tokens
    );
    assert!(text.contains("image 1: 64x48 image/png"), "{text}");
    // Three main turns of the first conversation became samples, in turn order; the side turn did
    // not.
    let report_samples = first.clone();
    let turns: Vec<u64> = report_samples.iter().map(|s| s.sample.turn).collect();
    assert_eq!(turns, vec![1, 2, 3]);
    let seqs: Vec<u64> = report.samples.iter().map(|s| s.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    for s in &report_samples {
        assert!(s.sample.images.is_empty());
        assert_eq!(s.sample.index, s.seq);
        assert_eq!(s.sample.loss_mask.len(), s.sample.response_length);
        assert_eq!(s.sample.rollout_log_probs.len(), s.sample.response_length);
    }
    // Turns 1 and 2 had a next state and were judged with 3 (scripted) votes; turn 3 closed the session.
    assert_eq!(
        report_samples[0].sample.metadata["votes"],
        serde_json::json!([1, 1, 1])
    );
    assert_eq!(report_samples[0].sample.reward.score, 1.0);
    assert_eq!(report_samples[1].sample.reward.score, -1.0);
    assert_eq!(
        report_samples[2].sample.metadata["excluded"],
        "no_next_state"
    );
    assert!(report_samples[2].sample.loss_mask.iter().all(|b| *b == 0));
    assert!(report_samples[2].sample.response.contains("<tool_call>"));
    // Non-streamed turns carry the engine's own ids; the streamed one is re-tokenized. The
    // tool-call turn has no position without a log-prob (no re-serialised JSON to misalign).
    let sources: Vec<&str> = report_samples
        .iter()
        .map(|s| s.sample.metadata["token_source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["engine", "retokenized", "engine"]);
    assert_eq!(
        report_samples[2].sample.metadata["logprob_missing_positions"],
        serde_json::json!([])
    );
    // The fake policy is a mixture of experts: the engine-id turns carry its routing of their
    // very tokens; the re-tokenized streamed turn's re-rendered tokens are not the engine's, so
    // it says why it has none.
    for (s, source) in report_samples.iter().zip(&sources) {
        let e = s.sample.rollout_routed_experts.as_ref();
        if *source == "engine" {
            let e = e.expect("experts on an engine-id turn");
            assert_eq!(e.shape, [s.sample.tokens.len() - 1, 4, 2]);
            assert_eq!(e.dtype, ps_core::ExpertWidth::Uint8);
        } else {
            assert!(e.is_none());
            assert_eq!(
                s.sample.metadata["routed_experts_missing"],
                "routed_experts_mismatch"
            );
        }
    }
    let routing = ps_fake_sglang::MoeRouting::default();
    assert_eq!(
        ps_app::policy_tokenizer::DEMO_MOE_SHAPE,
        ps_core::MoeShape {
            layers: routing.layers,
            top_k: routing.top_k,
            experts: Some(routing.experts as usize),
        }
    );
    assert!(text.contains("routed experts: "), "{text}");
    assert!(text.contains("ids from the engine") && text.contains("ids re-tokenized"));
    assert!(text.contains("=== samples pulled from GET /v1/rollout/samples ==="));
    assert!(text.contains("not captured"));
    assert!(text.contains("committed through seq"));
    assert!(
        text.contains(&report.replies[1]),
        "the streamed reply is printed"
    );
}

#[tokio::test]
async fn the_opd_demo_shows_an_accepted_hint_with_its_teacher_signal_and_the_rejected_turns() {
    let mut out = Vec::new();
    let report = ps_demo::run(&mut out, ps_config::Mode::Opd).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    // Turn 1's next state earned a hint; turn 2's did not; turn 3 had no next state.
    assert_eq!(report.samples.len(), 1);
    let s = &report.samples[0].sample;
    assert_eq!(s.turn, 1);
    assert_eq!(
        s.teacher_log_probs.as_ref().unwrap().len(),
        s.response_length
    );
    assert_eq!(s.reward.score, 1.0);
    assert!(text.contains("=== OPD decisions"));
    assert!(text.contains("no_hint") && text.contains("no_next_state"));
}

#[tokio::test]
async fn the_combine_demo_makes_one_distilled_and_one_rl_sample() {
    let mut out = Vec::new();
    let report = ps_demo::run(&mut out, ps_config::Mode::Combine)
        .await
        .unwrap();
    let kinds: Vec<&str> = report
        .samples
        .iter()
        .map(|s| s.sample.metadata["teacher"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["hinted", "rollout"]);
    assert_eq!(report.samples[1].sample.reward.score, -1.0);
    assert!(
        report
            .samples
            .iter()
            .all(|s| s.sample.teacher_log_probs.is_some())
    );
}
