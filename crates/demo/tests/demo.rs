#![allow(clippy::unwrap_used, clippy::expect_used)]

use ps_core::PositionSource;

#[tokio::test]
async fn the_demo_runs_end_to_end_and_captures_every_main_turn() {
    let mut out = Vec::new();
    let report = ps_demo::run(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(report.replies.len(), 3);
    // Three main turns captured; the side turn is not.
    assert_eq!(report.turns.len(), 3);
    assert!(
        report
            .turns
            .iter()
            .all(|t| t.session_id == "demo-session-1")
    );
    assert_eq!(report.turns.iter().filter(|t| t.streamed).count(), 1);
    // Each later turn's prompt holds the earlier conversation, so it is longer.
    assert!(report.turns[0].prompt_ids.len() < report.turns[1].prompt_ids.len());
    assert!(report.turns[1].prompt_ids.len() < report.turns[2].prompt_ids.len());
    // The tool call is in the third turn's rendered response.
    assert!(report.turns[2].response_text.contains("<tool_call>"));
    for t in &report.turns {
        assert!(t.alignment.sources.contains(&PositionSource::Sampled));
        assert_eq!(t.alignment.loss_mask.len(), t.response_ids.len());
    }
    assert!(text.contains("=== captured main turns ==="));
    assert!(text.contains("not captured"));
    assert!(
        text.contains(&report.replies[1]),
        "the streamed reply is printed"
    );
}
