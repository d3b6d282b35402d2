//! The inspect endpoints through the router (`tower::ServiceExt::oneshot`), over a hand-filled
//! history and an in-memory store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use ps_inspect::api::{Overview, SampleView, SessionList, SessionTimeline, TurnStatus};
use ps_inspect::{Inspect, InspectHistory, api_router, ui_router};
use serde_json::Value;
use tower::ServiceExt;

async fn get(app: axum::Router, uri: &str) -> (StatusCode, Value) {
    let r = app
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn app() -> axum::Router {
    api_router(support::filled().await)
}

#[tokio::test]
async fn overview_counts_requests_samples_drops_and_reads_the_store_and_live_state() {
    let (status, body) = get(app().await, "/v1/inspect/overview").await;
    assert_eq!(status, StatusCode::OK);
    let o: Overview = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(o.totals.requests, 6);
    assert_eq!((o.totals.main_turns, o.totals.side_turns), (5, 1));
    assert_eq!(o.totals.samples, 2);
    assert_eq!(o.totals.dropped["teacher_token_mismatch"], 1);
    assert_eq!(o.totals.teacher_mismatches, 1);
    let store = o.store.unwrap();
    assert_eq!((store.last_seq, store.committed, store.lag), (3, 0, 3));
    let live = o.live.unwrap();
    assert!(!live.submission_enabled);
    assert_eq!(live.pause_mode, "hold");
    assert_eq!(o.series.len(), 120);
    assert_eq!(o.series.iter().map(|p| p.requests).sum::<u64>(), 6);
    assert!(o.requests_per_s > 0.0);
    assert_eq!(o.history.sessions, 3);
    // Field names are the documented ones.
    for key in [
        "now_ms",
        "totals",
        "requests_per_s",
        "samples_per_s",
        "bucket_ms",
        "series",
        "live",
        "store",
        "history",
    ] {
        assert!(body.get(key).is_some(), "{key} missing from {body}");
    }
}

#[tokio::test]
async fn sessions_are_listed_newest_first_and_searchable() {
    let (status, body) = get(app().await, "/v1/inspect/sessions").await;
    assert_eq!(status, StatusCode::OK);
    let l: SessionList = serde_json::from_value(body).unwrap();
    let ids: Vec<_> = l.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, vec!["<b>bold</b>", "beta", "alpha"]);
    assert_eq!(l.sessions[1].state, "closed");
    assert_eq!((l.sessions[2].requests, l.sessions[2].samples), (3, 1));

    let (_, body) = get(app().await, "/v1/inspect/sessions?q=alp").await;
    let l: SessionList = serde_json::from_value(body).unwrap();
    assert_eq!((l.total, l.matched, l.sessions.len()), (3, 1, 1));
    let (_, body) = get(app().await, "/v1/inspect/sessions?q=%3Cb%3E").await;
    assert_eq!(body["sessions"][0]["id"], "<b>bold</b>");

    let (status, body) = get(app().await, "/v1/inspect/sessions?limit=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid_query");
}

#[tokio::test]
async fn a_timeline_shows_each_turn_in_order_with_votes_hint_teacher_and_sample() {
    let (status, body) = get(app().await, "/v1/inspect/sessions/alpha").await;
    assert_eq!(status, StatusCode::OK);
    let tl: SessionTimeline = serde_json::from_value(body).unwrap();
    let got: Vec<_> = tl.turns.iter().map(|t| (t.turn, t.status)).collect();
    assert_eq!(
        got,
        vec![
            (Some(1), TurnStatus::Submitted),
            (None, TurnStatus::Side),
            (Some(2), TurnStatus::WaitingNextState)
        ]
    );
    assert_eq!(
        tl.turns[0].prm_votes,
        Some(vec![Some(1), Some(1), Some(-1)])
    );
    assert_eq!(tl.turns[0].seq, Some(1));

    let (_, body) = get(app().await, "/v1/inspect/sessions/beta").await;
    let tl: SessionTimeline = serde_json::from_value(body).unwrap();
    assert_eq!(tl.turns[0].hint.as_deref(), Some(support::HOSTILE));
    assert_eq!(tl.turns[1].status, TurnStatus::Dropped);
    assert_eq!(
        tl.turns[1].reason.as_deref(),
        Some("teacher_token_mismatch")
    );
    assert_eq!(tl.turns[1].teacher.as_ref().unwrap().outcome, "mismatch");

    let (status, body) = get(app().await, "/v1/inspect/sessions/%3Cb%3Ebold%3C%2Fb%3E").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["session"]["id"], "<b>bold</b>");

    let (status, body) = get(app().await, "/v1/inspect/sessions/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
}

#[tokio::test]
async fn a_sample_is_read_from_the_store_by_seq() {
    let (status, body) = get(app().await, "/v1/inspect/samples/1").await;
    assert_eq!(status, StatusCode::OK);
    let s: SampleView = serde_json::from_value(body).unwrap();
    assert_eq!(
        (
            s.session_id.as_str(),
            s.turn,
            s.response_tokens,
            s.prompt_tokens
        ),
        ("alpha", 1, 6, 3)
    );
    assert_eq!(s.tokens[2].text.as_deref(), Some(support::HOSTILE));
    assert_eq!(s.tokens[4].lp, None);
    assert_eq!(s.tokens[4].marks, vec!["no_logprob", "template_inserted"]);
    assert!(s.tokens[1].marks.is_empty());

    let (_, body) = get(app().await, "/v1/inspect/samples/2").await;
    let s: SampleView = serde_json::from_value(body).unwrap();
    assert!(s.has_teacher);
    assert_eq!(s.tokens[2].adv, Some(-2.0));
    assert_eq!(s.tokens[0].top[0].text.as_deref(), Some("w200 "));

    // A sample of a session the history never saw (written before a restart) is read all the same.
    let (status, body) = get(app().await, "/v1/inspect/samples/3").await;
    assert_eq!(status, StatusCode::OK);
    let s: SampleView = serde_json::from_value(body).unwrap();
    assert_eq!(
        (s.session_id.as_str(), s.tokens.len(), s.status.as_str()),
        ("before-restart", support::LONG, "truncated")
    );

    let (status, body) = get(app().await, "/v1/inspect/samples/9").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = get(app().await, "/v1/inspect/samples/x").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_query"))
    );
    let bare = api_router(Inspect::new(std::sync::Arc::new(InspectHistory::default())));
    let (status, body) = get(bare, "/v1/inspect/samples/1").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("store_unavailable"))
    );
}

#[tokio::test]
async fn the_page_and_its_assets_are_compiled_in_with_a_strict_policy() {
    let r = ui_router()
        .oneshot(Request::get("/ui").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(r.headers()[header::LOCATION], "/ui/");
    for (path, ty) in [
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
    ] {
        let r = ui_router()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert_eq!(r.headers()[header::CONTENT_TYPE], ty);
        let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{csp}"
        );
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        // Nothing is fetched from elsewhere.
        assert!(!text.contains("http://") || path == "/ui/app.js", "{path}");
        assert!(!text.contains("https://"), "{path}");
    }
    // The script never inserts HTML.
    let js = include_str!("../assets/app.js");
    for forbidden in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!js.contains(forbidden), "app.js uses {forbidden}");
    }
}
