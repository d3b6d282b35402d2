//! The sampling parameters of main turns (issue 34): each sample records what was sent upstream,
//! a truncated sampler's sample is marked and counted, and `capture.sampling =
//! "full_distribution"` rewrites exactly `top_p`, `top_k` and `min_p` of main turns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ps_config::Settings;
use ps_core::SamplingMode;
use ps_fake_sglang::FakeSglang;
use serde_json::{Value, json};

use crate::common::{self, Server, http, settings, user};

async fn start(
    tune: impl FnOnce(&mut Settings),
) -> (Server, ps_fake_sglang::FakeHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut s = settings(&fake, dir.path());
    tune(&mut s);
    (Server::start(&s, &common::no_env).await, fake, dir)
}

/// One chat turn of `session` with `extra` fields in its body (streamed when `stream`); its
/// answer's message.
async fn turn(
    s: &Server,
    session: &str,
    turn_type: &str,
    history: &mut Vec<Value>,
    text: &str,
    extra: &Value,
    done: bool,
) {
    history.push(user(text));
    let mut body = json!({"messages": history});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = http()
        .post(format!("{}/v1/chat/completions", s.url))
        .header("x-session-id", session)
        .header("x-turn-type", turn_type)
        .header("x-session-done", if done { "1" } else { "0" })
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let stream = body["stream"] == true;
    let message = if stream {
        common::assemble_sse(&r.text().await.unwrap())
    } else {
        r.json::<Value>().await.unwrap()["choices"][0]["message"].clone()
    };
    if turn_type == "main" {
        history.push(json!({"role": "assistant", "content": message["content"]}));
    } else {
        history.pop();
    }
}

/// The chat-completion bodies the fake engine received, in order.
fn upstream_chats(fake: &ps_fake_sglang::FakeHandle) -> Vec<Value> {
    fake.requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.body)
        .collect()
}

/// Three sessions sent as the client wants them: one with `top_p: 0.9`, one with every
/// parameter spelling the full distribution, one with none. Each sample records its parameters;
/// the truncated one is marked and counted; the engine received the client's values untouched.
#[tokio::test]
async fn samples_record_their_sampling_and_truncated_ones_are_marked() {
    let (s, fake, _dir) = start(|_| {}).await;
    let cases = [
        (
            "truncated",
            json!({"temperature": 0.7, "top_p": 0.9}),
            "truncated",
        ),
        (
            "full",
            json!({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}),
            "full",
        ),
        ("defaults", json!({}), "engine_defaults"),
        (
            "streamed",
            json!({"stream": true, "top_k": 20, "top_p": 1.0, "min_p": 0.0}),
            "truncated",
        ),
    ];
    for (session, extra, _) in &cases {
        let mut h = Vec::new();
        turn(&s, session, "main", &mut h, "first", extra, false).await;
        turn(&s, session, "main", &mut h, "second", extra, true).await;
    }
    let samples = s.settle(8).await;
    assert_eq!(samples.len(), 8);
    for (session, extra, kind) in &cases {
        let mine: Vec<&Value> = samples
            .iter()
            .filter(|x| x["session_id"] == *session)
            .collect();
        assert_eq!(mine.len(), 2, "{session}");
        for sample in mine {
            let m = &sample["metadata"];
            assert_eq!(m["sampling_kind"], *kind, "{session}: {m}");
            for key in ["temperature", "top_p", "top_k", "min_p"] {
                let sent = extra.get(key).cloned().unwrap_or(Value::Null);
                assert_eq!(
                    m["sampling"][key].as_f64(),
                    sent.as_f64(),
                    "{session} {key}: {m}"
                );
            }
            assert_eq!(m["sampling"]["rewritten"], false);
            assert_eq!(
                m.get("truncated_sampling_without_sets").is_some(),
                *kind == "truncated",
                "{session}: {m}"
            );
        }
    }
    let st = s.status().await;
    assert_eq!(
        st["samples_by_sampling"],
        json!({"truncated": 4, "full": 2, "engine_defaults": 2}),
        "{st}"
    );
    // The engine got what the clients sent.
    let bodies = upstream_chats(&fake);
    assert_eq!(bodies.len(), 8);
    assert_eq!(bodies.iter().filter(|b| b["top_p"] == 0.9).count(), 2);
    assert!(
        bodies
            .iter()
            .filter(|b| b.get("top_p").is_none())
            .all(|b| b.get("top_k").is_none() && b.get("min_p").is_none())
    );
    s.stop().await;
}

/// `full_distribution` sends `top_p: 1`, `top_k: -1`, `min_p: 0` on main turns and changes
/// nothing else of the request: the same conversation sent to a server that keeps the client's
/// parameters reaches the engine with the same body but for those three. Side turns keep the
/// client's values. The samples say they were rewritten and count as full.
#[tokio::test]
async fn full_distribution_rewrites_three_parameters_of_main_turns_and_nothing_else() {
    let client = json!({
        "temperature": 0.6, "top_p": 0.8, "top_k": 12, "max_tokens": 64,
        "foo": {"bar": [1, 2]}, "seed": 7
    });
    let mut upstream = Vec::new();
    let mut samples = Vec::new();
    for mode in [SamplingMode::AsSent, SamplingMode::FullDistribution] {
        let (s, fake, _dir) = start(|c| c.capture.sampling = mode).await;
        let mut h = Vec::new();
        turn(&s, "a", "main", &mut h, "first", &client, false).await;
        turn(&s, "a", "side", &mut h, "summarise", &client, false).await;
        let mut streamed = client.clone();
        streamed["stream"] = json!(true);
        turn(&s, "a", "main", &mut h, "second", &streamed, true).await;
        samples.push(s.settle(2).await);
        upstream.push(upstream_chats(&fake));
        s.stop().await;
    }
    let (kept, rewritten) = (&upstream[0], &upstream[1]);
    assert_eq!(kept.len(), 3);
    assert_eq!(rewritten.len(), 3);
    for (i, (k, r)) in kept.iter().zip(rewritten).enumerate() {
        let side = i == 1;
        let mut k = k.clone();
        if !side {
            assert_eq!(r["top_p"], 1, "{r}");
            assert_eq!(r["top_k"], -1, "{r}");
            assert_eq!(r["min_p"], 0, "{r}");
            assert_eq!(r["temperature"], 0.6);
            k["top_p"] = json!(1);
            k["top_k"] = json!(-1);
            k["min_p"] = json!(0);
        }
        assert_eq!(&k, r, "request {i}");
    }
    for sample in &samples[1] {
        let m = &sample["metadata"];
        assert_eq!(m["sampling_kind"], "full", "{m}");
        assert_eq!(m["sampling"]["rewritten"], true);
        assert_eq!(m["sampling"]["temperature"], 0.6);
        assert!(m.get("truncated_sampling_without_sets").is_none());
    }
    for sample in &samples[0] {
        assert_eq!(sample["metadata"]["sampling_kind"], "truncated");
        assert_eq!(sample["metadata"]["truncated_sampling_without_sets"], true);
    }
}
