//! The page in a real browser (headless chromium through chromedriver), served by this crate's
//! routes over a hand-filled history and store: what a person sees on each view. Skipped without
//! chromium unless `POLICY_SERVING_REQUIRE_BROWSER=1`. The black-box tests of the binary drive the
//! same page on the demo conversation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use ps_inspect::{api_router, ui_router};
use ps_test_support::browser::Browser;
use ps_test_support::browser::Locator;
use serde_json::json;

/// Serves `app` on a loopback port; returns its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// The server's rule, in miniature: the inspect API needs `Bearer <key>`.
async fn admin_only(req: Request, next: Next) -> Response {
    let ok = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some("Bearer sekret");
    if ok || !req.uri().path().starts_with("/v1/") {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"message": "admin key", "type": "invalid_request_error", "code": "invalid_api_key"}})),
        )
            .into_response()
    }
}

async fn no_script_ran(b: &Browser) {
    assert_eq!(
        b.js("return typeof window.__pwned;", vec![]).await,
        json!("undefined"),
        "a hostile message ran script"
    );
    assert_eq!(
        b.js(
            "return document.querySelectorAll('#view img, #view script, #view b').length;",
            vec![]
        )
        .await,
        json!(0),
        "a hostile message became HTML elements"
    );
}

#[tokio::test]
async fn a_person_sees_sessions_turns_votes_hints_and_tokens() {
    let Some(b) = Browser::start().await else {
        return;
    };
    let base = serve(ui_router().merge(api_router(support::filled().await))).await;

    // Overview: counts, the store's lag, the paused state, drops by reason.
    b.goto(&format!("{base}/ui")).await;
    b.wait_text("#card-requests", "6 requests (5 main, 1 side)")
        .await;
    b.wait_text("#card-lag", "stored 3 · committed 0").await;
    b.wait_text("#card-submission", "paused").await;
    b.wait_text("#card-submission", "pause mode hold").await;
    b.wait_text("#dropped", "teacher_token_mismatch").await;
    b.wait_text("#pending", "waiting_next_state").await;
    assert_eq!(b.texts(".chart svg").await.len(), 5);

    // Sessions: newest first, a hostile id shown as its characters.
    b.goto(&format!("{base}/ui/#/sessions")).await;
    b.wait_text("#sessions", "alpha").await;
    let rows = b.texts("#sessions tr").await;
    assert!(rows[1].starts_with("<b>bold</b>"), "{rows:?}");
    assert!(
        rows[2].starts_with("beta") && rows[2].contains("closed: done"),
        "{rows:?}"
    );
    no_script_ran(&b).await;
    // Search by id.
    let search = b.wait_visible("#session-search").await;
    search.send_keys("alp").await.unwrap();
    b.wait_text(".search", "1 of 3 sessions held").await;
    assert_eq!(b.texts("#sessions tr").await.len(), 2);

    // Timeline of alpha: each turn in order, the votes and their majority, a link to the sample.
    b.goto(&format!("{base}/ui/#/session/alpha")).await;
    b.wait_text("#timeline", "waiting next state").await;
    let turns = b.texts("#timeline tr.turn").await;
    assert_eq!(turns.len(), 3, "{turns:?}");
    assert!(
        turns[0].contains("main") && turns[0].contains("submitted"),
        "{turns:?}"
    );
    assert!(turns[0].contains("+1 +1 -1 → 1"), "{turns:?}");
    assert!(turns[0].contains("seq 1 (reward 1)"), "{turns:?}");
    assert!(turns[1].contains("side"), "{turns:?}");

    // Timeline of beta: the hostile hint is text, the teacher's mismatch and why there is no sample.
    b.goto(&format!("{base}/ui/#/session/beta")).await;
    let hint = b.wait_text("#timeline .hint", "<script>").await;
    assert_eq!(hint, support::HOSTILE);
    b.wait_text("#timeline .hint-votes", "+1 failed").await;
    b.wait_text("#timeline", "mismatch: first differing position 0")
        .await;
    b.wait_text("#timeline .reason", "teacher_token_mismatch")
        .await;
    no_script_ran(&b).await;

    // The sample view: a chip per response token, coloured by its rollout log-prob; the
    // template-inserted position without a log-prob is marked.
    b.goto(&format!("{base}/ui/#/sample/1")).await;
    b.wait_text("#sample-seq", "seq 1").await;
    b.wait_text("#sample-facts", "marked positions").await;
    let chips = b.texts("#tokens .tok").await;
    assert_eq!(
        chips,
        vec![
            "w100 ",
            "w101 ",
            support::HOSTILE,
            "w102 ",
            "↵",
            "<|im_end|>"
        ]
    );
    // lp -0.01 (p ≈ 0.99) is green, lp -5 (p ≈ 0.007) is red.
    let (r0, g0, _) = b.token_colour(0).await;
    let (r2, g2, _) = b.token_colour(2).await;
    assert!(g0 > r0 + 40, "a likely token is green: {:?}", (r0, g0));
    assert!(r2 > g2 + 40, "an unlikely token is red: {:?}", (r2, g2));
    let class = |i: usize| {
        let b = &b;
        async move {
            b.js(
                "return document.querySelectorAll('#tokens .tok')[arguments[0]].className;",
                vec![json!(i)],
            )
            .await
            .as_str()
            .unwrap()
            .to_owned()
        }
    };
    assert!(class(4).await.contains("marked") && class(4).await.contains("none"));
    assert!(!class(0).await.contains("marked"));
    // The prompt is collapsed, and its hostile text is text.
    let open = b
        .js("return document.getElementById('prompt').open;", vec![])
        .await;
    assert_eq!(open, json!(false));
    let prompt = b
        .js(
            "return document.querySelector('#prompt pre').textContent;",
            vec![],
        )
        .await;
    assert!(prompt.as_str().unwrap().contains(support::HOSTILE));
    no_script_ran(&b).await;
    // Hovering shows id, text and both log-probs; clicking pins it.
    let chip = b.client.find(Locator::Css("#tokens .tok")).await.unwrap();
    chip.click().await.unwrap();
    let tip = b.wait_text("#tip", "rollout log-prob").await;
    assert!(tip.contains("id\t100") || tip.contains("id 100"), "{tip}");
    assert!(tip.contains("\"w100 \""), "{tip}");
    assert!(tip.contains("-0.0100"), "{tip}");
    // Loss-mask colouring: the masked position is grey.
    let mask = b
        .client
        .find(Locator::Css("input[value=mask]"))
        .await
        .unwrap();
    mask.click().await.unwrap();
    b.wait_text("#legend", "not trained (0)").await;
    let (r4, g4, b4) = b.token_colour(4).await;
    assert!(r4 == g4 && g4 == b4, "masked is grey: {:?}", (r4, g4, b4));

    // An OPD sample: advantage colouring by default, the hint, the teacher's top-K on hover.
    b.goto(&format!("{base}/ui/#/sample/2")).await;
    b.wait_text("#legend", "teacher − rollout").await;
    let hint = b.wait_text("#sample-hint", "<img").await;
    assert_eq!(hint, support::HOSTILE);
    let (ra, _, ba) = b.token_colour(0).await; // teacher -0.1 vs rollout -1.0: positive, blue
    let (rb, _, bb) = b.token_colour(2).await; // teacher -4.0 vs rollout -2.0: negative, red
    assert!(ba > ra && rb > bb, "{:?} {:?}", (ra, ba), (rb, bb));
    let chip = b.client.find(Locator::Css("#tokens .tok")).await.unwrap();
    chip.click().await.unwrap();
    let tip = b.wait_text("#tip", "teacher top-2").await;
    assert!(tip.contains("\"w7 \""), "{tip}");
    no_script_ran(&b).await;

    // A long response of a session the history never saw (a sample written before a restart):
    // every token is a chip, the last one's tip works.
    b.goto(&format!("{base}/ui/#/sample/3")).await;
    b.wait_text("#sample-facts", "before-restart").await;
    let n = b
        .js(
            "return document.querySelectorAll('#tokens .tok').length;",
            vec![],
        )
        .await;
    assert_eq!(n, json!(support::LONG));
    b.js(
        "const c = document.querySelectorAll('#tokens .tok'); c[c.length - 1].scrollIntoView(); c[c.length - 1].click();",
        vec![],
    )
    .await;
    b.wait_text("#tip", &format!("position\t{}", support::LONG - 1))
        .await;

    // A seq the store does not hold.
    b.goto(&format!("{base}/ui/#/sample/99")).await;
    b.wait_text("#error", "no sample 99").await;
    b.close().await;
}

#[tokio::test]
async fn the_admin_key_is_asked_once_and_kept_for_the_tab() {
    let Some(b) = Browser::start().await else {
        return;
    };
    let app = ui_router()
        .merge(api_router(support::filled().await))
        .layer(middleware::from_fn(admin_only));
    let base = serve(app).await;
    b.goto(&format!("{base}/ui/")).await;
    b.wait_visible("#key-form").await;
    b.submit_key("wrong").await;
    b.wait_text("#key-message", "That key was refused").await;
    b.submit_key("sekret").await;
    b.wait_text("#card-requests", "6 requests").await;
    // Another view and a reload: no second prompt.
    b.goto(&format!("{base}/ui/#/session/alpha")).await;
    b.wait_text("#timeline", "submitted").await;
    b.client.refresh().await.unwrap();
    b.wait_text("#timeline", "submitted").await;
    let hidden = b
        .js("return document.getElementById('key-form').hidden;", vec![])
        .await;
    assert_eq!(hidden, json!(true));
    let stored = b
        .js(
            "return sessionStorage.getItem('policy-serving-admin-key');",
            vec![],
        )
        .await;
    assert_eq!(stored, json!("sekret"));
    b.close().await;
}
