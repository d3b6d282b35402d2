#![allow(clippy::unwrap_used, clippy::expect_used)]

#[tokio::test]
async fn the_demo_runs_end_to_end_and_the_trainer_side_gets_every_main_turn() {
    let mut out = Vec::new();
    let report = ps_demo::run(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(report.replies.len(), 3);
    // Three main turns became samples, in turn order; the side turn did not.
    let turns: Vec<u64> = report.samples.iter().map(|s| s.sample.turn).collect();
    assert_eq!(turns, vec![1, 2, 3]);
    let seqs: Vec<u64> = report.samples.iter().map(|s| s.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    for s in &report.samples {
        assert_eq!(s.sample.session_id, "demo-session-1");
        assert_eq!(s.sample.index, s.seq);
        assert_eq!(s.sample.loss_mask.len(), s.sample.response_length);
        assert_eq!(s.sample.rollout_log_probs.len(), s.sample.response_length);
    }
    // Turns 1 and 2 had a next state and were judged with 3 votes; turn 3 closed the session.
    for s in &report.samples[..2] {
        assert_eq!(s.sample.metadata["votes"].as_array().unwrap().len(), 3);
    }
    assert_eq!(
        report.samples[2].sample.metadata["excluded"],
        "no_next_state"
    );
    assert!(report.samples[2].sample.loss_mask.iter().all(|b| *b == 0));
    assert!(report.samples[2].sample.response.contains("<tool_call>"));
    assert!(text.contains("=== samples pulled from GET /v1/rollout/samples ==="));
    assert!(text.contains("not captured"));
    assert!(text.contains("committed through seq"));
    assert!(
        text.contains(&report.replies[1]),
        "the streamed reply is printed"
    );
}
