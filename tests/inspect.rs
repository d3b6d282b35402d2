//! The inspection page of the real binary, in a real browser: `policy-serving demo` serves its
//! scripted conversation, a message that tries to run script is sent through the proxy, and
//! headless chromium (through chromedriver) opens each view and checks what a person sees.
//! Skipped without chromium unless `POLICY_SERVING_REQUIRE_BROWSER=1` (CI).
//!
//! A second test starts `policy-serving serve` with an admin key (in front of the in-process fake
//! SGLang): the page asks for the key, a wrong one keeps the data hidden with a message saying so,
//! and the right one shows the session.
//!
//! With `POLICY_SERVING_SCREENSHOTS=DIR` it also writes `inspect-overview.png`,
//! `inspect-timeline.png` and `inspect-sample.png` there (`just screenshots`: `docs/img`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::harness;

use std::time::Duration;

use harness::{Demo, KillOnDrop, free_port};
use ps_test_support::browser::Browser;
use serde_json::{Value, json};

const HOSTILE: &str =
    "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">";
const XSS_SESSION: &str = "xss-<b>bold</b>";

async fn chat(base: &str, session: &str, messages: Value, done: bool) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .header("x-session-id", session)
        .header("x-turn-type", "main")
        .header("x-session-done", if done { "1" } else { "0" })
        .json(&json!({"messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

async fn api(base: &str, path: &str) -> Value {
    reqwest::get(format!("{base}{path}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn no_script_ran(b: &Browser) {
    assert_eq!(
        b.js("return typeof window.__pwned;", vec![]).await,
        json!("undefined")
    );
    assert_eq!(
        b.js(
            "return document.querySelectorAll('#view img, #view script, #view b').length;",
            vec![]
        )
        .await,
        json!(0)
    );
}

async fn shot(b: &Browser, name: &str) {
    if let Some(dir) = std::env::var_os("POLICY_SERVING_SCREENSHOTS") {
        let path = std::path::Path::new(&dir).join(format!("inspect-{name}.png"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, b.screenshot().await).unwrap();
        eprintln!("wrote {}", path.display());
    }
}

#[tokio::test]
async fn the_demo_conversation_is_seen_session_by_session_and_token_by_token() {
    let Some(b) = Browser::start().await else {
        return;
    };
    let demo = Demo::start("rl");
    let base = demo.base.clone();
    assert!(
        demo.printed.contains("committed through seq 4"),
        "{}",
        demo.printed
    );

    // A conversation whose message tries to run script, through the proxy.
    let user = |t: &str| json!({"role": "user", "content": t});
    chat(&base, XSS_SESSION, json!([user(HOSTILE)]), false).await;
    let second = json!([user(HOSTILE), {"role": "assistant", "content": "ok"}, user("thanks")]);
    chat(&base, XSS_SESSION, second, true).await;
    let xss_path = format!(
        "/v1/inspect/sessions/{}",
        XSS_SESSION
            .replace('<', "%3C")
            .replace('>', "%3E")
            .replace('/', "%2F")
    );
    let mut xss_seq = None;
    for _ in 0..200 {
        let tl = api(&base, &xss_path).await;
        xss_seq = tl["turns"][0]["seq"].as_u64();
        if xss_seq.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let xss_seq = xss_seq.expect("the hostile turn became a sample");

    // Overview: the requests, the samples, submission enabled, the lag the trainer left.
    b.goto(&format!("{base}/ui/")).await;
    b.wait_text("#card-requests", "main").await;
    b.wait_text("#card-samples", "stored").await;
    b.wait_text("#card-submission", "enabled").await;
    b.wait_text("#card-lag", "committed 4").await;
    shot(&b, "overview").await;

    // Sessions: the demo's and the hostile one, its id shown as characters.
    b.goto(&format!("{base}/ui/#/sessions")).await;
    b.wait_text("#sessions", "demo-session-1").await;
    b.wait_text("#sessions", XSS_SESSION).await;
    no_script_ran(&b).await;

    // The demo session's timeline: its turns in order, main and side, the votes and majority,
    // the links to the samples.
    b.goto(&format!("{base}/ui/#/session/demo-session-1")).await;
    b.wait_text("#timeline", "excluded").await;
    let turns = b.texts("#timeline tr.turn").await;
    assert_eq!(turns.len(), 4, "{turns:?}");
    assert!(
        turns[0].contains("main") && turns[0].contains("+1 +1 +1 → 1"),
        "{turns:?}"
    );
    assert!(turns[1].contains("side"), "{turns:?}");
    assert!(
        turns[2].contains("streamed") && turns[2].contains("-1 -1 -1 → -1"),
        "{turns:?}"
    );
    assert!(turns[0].contains("seq 1"), "{turns:?}");
    shot(&b, "timeline").await;

    // The streamed turn's sample: a chip per token, coloured by its rollout log-prob, the
    // template-inserted position without a log-prob marked.
    let sample = api(&base, "/v1/inspect/samples/2").await;
    let tokens = sample["tokens"].as_array().unwrap();
    b.goto(&format!("{base}/ui/#/sample/2")).await;
    b.wait_text("#sample-seq", "seq 2").await;
    let chips = b.texts("#tokens .tok").await;
    assert_eq!(chips.len(), tokens.len());
    let lp = |i: usize| tokens[i]["lp"].as_f64();
    let (hi, _) = (0..tokens.len())
        .filter_map(|i| lp(i).map(|v| (i, v)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    let (lo, _) = (0..tokens.len())
        .filter_map(|i| lp(i).map(|v| (i, v)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    let (rh, gh, _) = b.token_colour(hi).await;
    let (rl, gl, _) = b.token_colour(lo).await;
    assert!(
        gh - rh > gl - rl,
        "the likelier token is greener: {:?} vs {:?}",
        (rh, gh),
        (rl, gl)
    );
    let marked = tokens
        .iter()
        .position(|t| t["marks"].as_array().is_some_and(|m| !m.is_empty()))
        .expect("the streamed turn has a marked position");
    let class = b
        .js(
            "return document.querySelectorAll('#tokens .tok')[arguments[0]].className;",
            vec![json!(marked)],
        )
        .await;
    assert!(class.as_str().unwrap().contains("marked"), "{class}");
    // Hovering a token shows its id, text and log-probs.
    b.js(
        "document.querySelectorAll('#tokens .tok')[arguments[0]].click();",
        vec![json!(hi)],
    )
    .await;
    let tip = b.wait_text("#tip", "rollout log-prob").await;
    assert!(tip.contains(&format!("id\t{}", tokens[hi]["id"])), "{tip}");
    assert!(tip.contains(&format!("{:.4}", lp(hi).unwrap())), "{tip}");
    shot(&b, "sample").await;

    // The picture's sample (the demo's second conversation, seq 4): its prompt shows the image
    // where the template wrote it, as a thumbnail fetched from the blobs route, and its run of
    // pad tokens as one chip.
    let picture = api(&base, "/v1/inspect/samples/4").await;
    assert_eq!(picture["session_id"], "demo-session-2", "{picture}");
    let pads = picture["images"][0]["tokens"].as_u64().unwrap();
    b.goto(&format!("{base}/ui/#/sample/4")).await;
    b.wait_text("#prompt .image-chip", &format!("image 1 · {pads} tokens"))
        .await;
    let mut width = json!(0);
    for _ in 0..100 {
        width = b
            .js(
                "const i = document.querySelector('#prompt img.thumb'); return i ? i.naturalWidth : 0;",
                vec![],
            )
            .await;
        if width == json!(64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(width, json!(64), "the thumbnail is the 64x48 image");

    // The hostile message: shown as text in the timeline's sample and its prompt, no script run.
    b.goto(&format!("{base}/ui/#/sample/{xss_seq}")).await;
    b.wait_text("#sample-facts", XSS_SESSION).await;
    let prompt = b
        .js(
            "return document.querySelector('#prompt pre').textContent;",
            vec![],
        )
        .await;
    assert!(prompt.as_str().unwrap().contains(HOSTILE), "{prompt}");
    no_script_ran(&b).await;
    b.close().await;
}

const ADMIN_KEY: &str = "admin-key-3e9d51c7";
const GUARDED_SESSION: &str = "guarded-session-1";

/// `policy-serving serve` with `server.admin_key_env`, in front of an in-process fake SGLang; a
/// two-turn session served through it. Returns the server, its base URL and the fake.
async fn serve_with_admin_key(
    dir: &std::path::Path,
) -> (KillOnDrop, String, ps_fake_sglang::FakeHandle) {
    let fake = ps_fake_sglang::FakeSglang::builder().spawn().await.unwrap();
    let port = free_port();
    let config = dir.join("settings.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nport = {port}\ndefault_turn_type = \"main\"\nadmin_key_env = \"T_ADMIN_KEY\"\n\
             [sglang]\nchat_url = \"{}\"\n[prm]\nrouter_url = \"{}\"\n[store]\npath = \"{}\"\n\
             [logging]\nlevel = \"warn\"\n",
            fake.chat_url(),
            fake.generate_url(),
            dir.join("store").display()
        ),
    )
    .unwrap();
    let server = KillOnDrop(
        std::process::Command::new(harness::policy_serving())
            .args(["serve", "--config"])
            .arg(&config)
            .env("T_ADMIN_KEY", ADMIN_KEY)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    // A generous bound on the start, only so that a server that never listens fails clearly.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while http.get(format!("{base}/health")).send().await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never answered /health"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let user = |t: &str| json!({"role": "user", "content": t});
    chat(
        &base,
        GUARDED_SESSION,
        json!([user("Plan a trip. FAKE_VOTES=1")]),
        false,
    )
    .await;
    let second = json!([user("Plan a trip. FAKE_VOTES=1"), {"role": "assistant", "content": "ok"}, user("thanks FAKE_VOTES=1")]);
    chat(&base, GUARDED_SESSION, second, true).await;
    (server, base, fake)
}

#[tokio::test]
async fn the_real_binary_asks_for_its_admin_key_and_shows_nothing_without_it() {
    let Some(b) = Browser::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_server, base, _fake) = serve_with_admin_key(dir.path()).await;
    let http = reqwest::Client::new();
    let timeline = format!("{base}/v1/inspect/sessions/{GUARDED_SESSION}");
    // The API itself: refused without the key and with a wrong one, open with the right one.
    let status = |key: Option<&'static str>| {
        let mut req = http.get(&timeline);
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(None).await, 401);
    assert_eq!(status(Some("wrong-key")).await, 401);
    assert_eq!(status(Some(ADMIN_KEY)).await, 200);

    // The page asks for the key before it shows anything.
    b.goto(&format!("{base}/ui/#/sessions")).await;
    b.wait_visible("#key-form").await;
    b.wait_text("#key-form", "admin key").await;
    let hidden = || async {
        b.js(
            "return [document.getElementById('view').hidden, document.body.innerText.includes(arguments[0])];",
            vec![json!(GUARDED_SESSION)],
        )
        .await
    };
    assert_eq!(
        hidden().await,
        json!([true, false]),
        "nothing shown before the key"
    );

    // A wrong key: refused, said so, still nothing shown, and the prompt is back.
    b.submit_key("wrong-key").await;
    b.wait_text("#key-message", "That key was refused").await;
    b.wait_visible("#key-input").await;
    assert_eq!(
        hidden().await,
        json!([true, false]),
        "nothing shown with a wrong key"
    );

    // The right key: the session list shows the session, and its timeline its two turns.
    b.submit_key(ADMIN_KEY).await;
    b.wait_text("#sessions", GUARDED_SESSION).await;
    b.goto(&format!("{base}/ui/#/session/{GUARDED_SESSION}"))
        .await;
    b.wait_text("#session-id", GUARDED_SESSION).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let turns = b.texts("#timeline tr.turn").await;
        if turns.len() == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the timeline shows {turns:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let form_hidden = b
        .js("return document.getElementById('key-form').hidden;", vec![])
        .await;
    assert_eq!(form_hidden, json!(true));
    b.close().await;
}
