//! Image turns through `serve`, in front of the fake engine serving the mini-vl model (a
//! Qwen-VL-style engine: each image's pad expanded to its token count): every image turn becomes
//! a sample whose prompt ids are the engine's own, on the engine's ids and re-tokenized, streamed
//! and not, from an SGLang-like and a vLLM-like engine; the images come back byte-identical from
//! the rollout API (`GET /v1/rollout/blobs/{hash}` and inline in MessagePack pages); every part
//! that cannot be captured exactly gives its counted drop reason and never a sample.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use base64::Engine as _;
use ps_chat_template::ChatTokenizer;
use ps_config::Settings;
use ps_core::TokenIdsMode;
use ps_fake_sglang::{FakeHandle, FakeSglang, MINI_VL_MODEL_DIR, Quirks};
use serde_json::{Value, json};
use sha2::Digest;

const RED_PNG: &[u8] = include_bytes!("fixtures/images/red-64x48.png");
const BLUE_JPG: &[u8] = include_bytes!("fixtures/images/blue-300x200.jpg");
const GREEN_GIF: &[u8] = include_bytes!("fixtures/images/green-20x20.gif");
const WIDE_WEBP: &[u8] = include_bytes!("fixtures/images/wide-900x120.webp");

fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn image(mime: &str, bytes: &[u8]) -> Value {
    json!({"type": "image_url", "image_url": {"url": data_url(mime, bytes)}})
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", sha2::Sha256::digest(bytes))
}

async fn vl_fake(quirks: Option<Quirks>) -> FakeHandle {
    let mut b = FakeSglang::builder()
        .tokenizer(Arc::new(ChatTokenizer::mini_vl()))
        .model_path(Some(MINI_VL_MODEL_DIR));
    if let Some(q) = quirks {
        b = b.quirks(q);
    }
    b.spawn().await.unwrap()
}

fn vl_settings(fake: &FakeHandle, store: &std::path::Path) -> Settings {
    let mut s = common::settings(fake, store);
    s.server.model_dir = Some(MINI_VL_MODEL_DIR.into());
    s
}

async fn chat(url: &str, session: &str, body: Value, done: bool) -> reqwest::Response {
    common::http()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-session-id", session)
        .header("x-session-done", if done { "1" } else { "0" })
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The assistant message of an answer, streamed or not.
async fn answer(r: reqwest::Response, stream: bool) -> Value {
    assert_eq!(r.status(), 200);
    if stream {
        common::assemble_sse(&r.text().await.unwrap())
    } else {
        r.json::<Value>().await.unwrap()["choices"][0]["message"].clone()
    }
}

/// The prompt ids the engine used for `body`: the same request sent to it directly, asking for
/// its ids.
async fn engine_prompt_ids(fake: &FakeHandle, body: &Value) -> Vec<u64> {
    let mut body = body.clone();
    body["stream"] = json!(false);
    body["return_token_ids"] = json!(true);
    body["logprobs"] = json!(true);
    let a: Value = common::http()
        .post(fake.chat_url())
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids = a["sglext"]["input_ids"]
        .as_array()
        .or(a["prompt_token_ids"].as_array())
        .or(a["choices"][0]["prompt_token_ids"].as_array())
        .unwrap_or_else(|| panic!("no prompt ids in {a}"));
    ids.iter().map(|v| v.as_u64().unwrap()).collect()
}

/// A three-turn conversation with images in its first and third user messages; returns the
/// request bodies the engine got, in order.
async fn conversation(url: &str, fake: &FakeHandle, session: &str, stream: bool) -> Vec<Value> {
    fake.clear_requests();
    let mut history = vec![json!({"role": "user", "content": [
        text("What is in"), image("image/png", RED_PNG), text("this picture?")]})];
    let a = answer(
        chat(
            url,
            session,
            json!({"messages": history, "stream": stream}),
            false,
        )
        .await,
        stream,
    )
    .await;
    history.push(a);
    history.push(json!({"role": "user", "content": "And its colour?"}));
    let a = answer(
        chat(
            url,
            session,
            json!({"messages": history, "stream": stream}),
            false,
        )
        .await,
        stream,
    )
    .await;
    history.push(a);
    history.push(json!({"role": "user", "content": [
        image("image/jpeg", BLUE_JPG), text("Compare with"), image("image/gif", GREEN_GIF)]}));
    answer(
        chat(
            url,
            session,
            json!({"messages": history, "stream": stream}),
            true,
        )
        .await,
        stream,
    )
    .await;
    fake.requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.body)
        .collect()
}

#[tokio::test]
async fn image_turns_become_samples_with_the_engines_prompt_ids_on_every_path() {
    // (engine, sglang.token_ids, client stream, expected token source)
    let variants = [
        (None, TokenIdsMode::Auto, false, "engine"),
        (None, TokenIdsMode::Retokenize, false, "retokenized"),
        (None, TokenIdsMode::Auto, true, "retokenized"),
        (Some(Quirks::vllm()), TokenIdsMode::Auto, true, "engine"),
        (Some(Quirks::vllm()), TokenIdsMode::Auto, false, "engine"),
    ];
    for (i, (quirks, token_ids, stream, source)) in variants.into_iter().enumerate() {
        let what = format!("variant {i}: token_ids {token_ids:?}, stream {stream}");
        let fake = vl_fake(quirks).await;
        let dir = tempfile::tempdir().unwrap();
        let mut s = vl_settings(&fake, dir.path());
        s.sglang.token_ids = token_ids;
        let server = common::Server::start(&s, &common::no_env).await;
        let bodies = conversation(&server.url, &fake, &format!("img-{i}"), stream).await;
        assert_eq!(bodies.len(), 3, "{what}");
        let samples = server.settle(3).await;
        let st = server.status().await;
        assert_eq!(samples.len(), 3, "{what}: every turn a sample: {st}");
        for (sample, body) in samples.iter().zip(&bodies) {
            let tokens: Vec<u64> = serde_json::from_value(sample["tokens"].clone()).unwrap();
            let n = tokens.len() - sample["response_length"].as_u64().unwrap() as usize;
            assert_eq!(
                tokens[..n],
                engine_prompt_ids(&fake, body).await[..],
                "{what}: turn {}: the prompt ids are the engine's",
                sample["turn"]
            );
            assert_eq!(sample["metadata"]["token_source"], source, "{what}");
        }
        // Images in prompt order, the first one re-sent by every later turn.
        let hashes = |s: &Value| -> Vec<String> {
            s["images"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|i| i["hash"].as_str().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(hashes(&samples[0]), [sha(RED_PNG)], "{what}");
        assert_eq!(hashes(&samples[1]), [sha(RED_PNG)], "{what}");
        assert_eq!(
            hashes(&samples[2]),
            [sha(RED_PNG), sha(BLUE_JPG), sha(GREEN_GIF)],
            "{what}"
        );
        // Each image's run of pads in the prompt is as long as its `tokens`.
        let pad = ChatTokenizer::mini_vl().vision().unwrap().image_pad_id as u64;
        let tokens: Vec<u64> = serde_json::from_value(samples[2]["tokens"].clone()).unwrap();
        let runs: Vec<u64> = tokens
            .chunk_by(|a, b| a == b)
            .filter(|r| r[0] == pad)
            .map(|r| r.len() as u64)
            .collect();
        let counts: Vec<u64> = samples[2]["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["tokens"].as_u64().unwrap())
            .collect();
        assert_eq!(runs, counts, "{what}");
        assert!(counts.iter().all(|&c| (4..=64).contains(&c)), "{counts:?}");
        server.stop().await;
    }
}

#[tokio::test]
async fn images_come_back_byte_identical_from_the_rollout_api_and_go_after_commit() {
    images_through_the_rollout_api(None).await;
}

/// The same over the Redis store (a server of its own, or CI's shared one).
#[tokio::test]
async fn images_come_back_byte_identical_over_redis_too() {
    let Some(redis) = ps_test_support::redis::TestRedis::shared_or_start() else {
        return;
    };
    images_through_the_rollout_api(Some(&redis)).await;
}

async fn images_through_the_rollout_api(redis: Option<&ps_test_support::redis::TestRedis>) {
    let fake = vl_fake(None).await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = vl_settings(&fake, dir.path());
    s.store.retain_committed = 0;
    if let Some(redis) = redis {
        s.store.kind = ps_config::StoreKind::Redis;
        s.store.redis.url = redis.url().to_owned();
        s.store.redis.deployment = redis.deployment().into();
    }
    let server = common::Server::start(&s, &common::no_env).await;
    conversation(&server.url, &fake, "blobs", false).await;
    let samples = server.settle(3).await;
    assert_eq!(samples.len(), 3);
    for (bytes, mime) in [
        (RED_PNG, "image/png"),
        (BLUE_JPG, "image/jpeg"),
        (GREEN_GIF, "image/gif"),
    ] {
        let r = common::http()
            .get(format!("{}/v1/rollout/blobs/{}", server.url, sha(bytes)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(&r.bytes().await.unwrap()[..], bytes, "{mime}");
        let meta = samples[2]["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["hash"] == sha(bytes))
            .unwrap();
        assert_eq!(meta["mime"], mime);
    }
    // Inline in a MessagePack page, each image once.
    let page = common::http()
        .get(format!(
            "{}/v1/rollout/samples?after=0&max=100&format=msgpack",
            server.url
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    #[derive(serde::Deserialize)]
    struct Page {
        samples: Vec<Value>,
        images: std::collections::HashMap<String, serde_bytes::ByteBuf>,
    }
    let page: Page = rmp_serde::from_slice(&page).unwrap();
    assert_eq!(page.samples.len(), 3);
    assert_eq!(page.images.len(), 3, "each image once");
    assert_eq!(&page.images[&sha(BLUE_JPG)][..], BLUE_JPG);
    // Bad and unknown hashes.
    let get = |h: String| {
        let url = format!("{}/v1/rollout/blobs/{h}", server.url);
        async move { common::http().get(url).send().await.unwrap() }
    };
    let r = get("not-a-hash".into()).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_blob_hash"
    );
    let r = get(sha(b"never sent")).await;
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "blob_not_found"
    );
    // Committed: the images go with their last sample.
    let r = common::http()
        .post(format!("{}/v1/rollout/commit", server.url))
        .json(&json!({"through": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(get(sha(RED_PNG)).await.status(), 404);
    server.stop().await;
}

#[tokio::test]
async fn parts_that_cannot_be_captured_exactly_are_dropped_with_their_counted_reasons() {
    let fake = vl_fake(None).await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = vl_settings(&fake, dir.path());
    s.capture.max_images_per_turn = 2;
    s.capture.max_image_mib = 1;
    let server = common::Server::start(&s, &common::no_env).await;
    let big_png = {
        // A valid PNG header followed by 2 MiB: over the 1 MiB limit.
        let mut b = RED_PNG.to_vec();
        b.extend(std::iter::repeat_n(0u8, 2 << 20));
        b
    };
    let cases = [
        (
            json!({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}),
            "image_remote",
        ),
        (image("image/png", b"not an image"), "image_undecodable"),
        (image("image/png", &big_png), "image_too_large"),
        (
            json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
            "audio_unsupported",
        ),
        (
            json!({"type": "file", "file": {"file_id": "f"}}),
            "file_unsupported",
        ),
    ];
    for (i, (part, _)) in cases.iter().enumerate() {
        let body = json!({"messages": [{"role": "user", "content": [text("look"), part]}]});
        // The engine answers what it can; whatever it answers, no sample comes of it.
        let _ = chat(&server.url, &format!("bad-{i}"), body, true).await;
    }
    let three = json!({"messages": [{"role": "user", "content": [
        image("image/png", RED_PNG), image("image/webp", WIDE_WEBP), image("image/gif", GREEN_GIF)]}]});
    let r = chat(&server.url, "too-many", three, true).await;
    assert_eq!(r.status(), 200, "forwarded as sent");
    // A good turn after them still trains.
    let good = json!({"messages": [{"role": "user", "content": [text("hi"), image("image/webp", WIDE_WEBP)]}]});
    assert_eq!(chat(&server.url, "good", good, true).await.status(), 200);
    let samples = server.resolved(cases.len() as u64 + 2).await;
    assert_eq!(
        samples.len(),
        1,
        "only the good turn: {}",
        server.status().await
    );
    assert_eq!(samples[0]["session_id"], "good");
    let st = server.status().await;
    let reasons = &st["turns_abandoned_by_reason"];
    for (_, reason) in &cases {
        assert!(
            reasons[*reason].as_u64().unwrap_or(0) >= 1,
            "{reason} counted: {reasons}"
        );
    }
    assert_eq!(reasons["too_many_images"], 1, "{reasons}");
    server.stop().await;
}

#[tokio::test]
async fn a_text_model_never_trains_on_an_image_turn() {
    // The text-only mini model: refused on the chat path.
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut s = common::settings(&fake, dir.path());
    s.server.model_dir = Some(ps_fake_sglang::MINI_MODEL_DIR.into());
    let server = common::Server::start(&s, &common::no_env).await;
    let body = json!({"messages": [{"role": "user", "content": [text("What?"), image("image/png", RED_PNG)]}]});
    assert_eq!(chat(&server.url, "t", body, true).await.status(), 200);
    let samples = server.resolved(1).await;
    assert!(samples.is_empty());
    assert_eq!(
        server.status().await["turns_abandoned_by_reason"]["image_unsupported"],
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn a_next_state_with_an_image_reaches_the_judges_as_a_stated_placeholder() {
    let fake = vl_fake(None).await;
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&vl_settings(&fake, dir.path()), &common::no_env).await;
    let mut history = vec![json!({"role": "user", "content": "Describe a red square."})];
    let a = answer(
        chat(&server.url, "ns", json!({"messages": history}), false).await,
        false,
    )
    .await;
    history.push(a);
    history.push(json!({"role": "user", "content": [
        text("Like"), image("image/png", RED_PNG), text("this one? FAKE_VOTES=1")]}));
    answer(
        chat(&server.url, "ns", json!({"messages": history}), true).await,
        false,
    )
    .await;
    let samples = server.resolved(2).await;
    let first = samples.iter().find(|s| s["turn"] == 1).unwrap();
    assert_ne!(first["metadata"]["excluded"], "no_next_state", "{first}");
    assert!(first["metadata"]["votes"].is_array(), "{first}");
    // The judges read the image as the placeholder, between the texts (their prompts as the
    // fake's /generate received them).
    let judged: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/generate")
        .map(|r| r.body.to_string())
        .collect();
    assert!(!judged.is_empty());
    assert!(
        judged.iter().all(|b| b.contains("Like [image] this one?")),
        "{judged:?}"
    );
    server.stop().await;
}

/// Every kind of content part through every mode, streamed and not: a sample comes only from a
/// turn whose every part is captured exactly (text, and a VL policy's inline images, which the
/// sample then lists); every other part drops its turn, and the later turns whose history holds
/// it, with a counted reason.
#[tokio::test]
async fn no_mode_makes_a_sample_of_a_part_not_captured_exactly() {
    let parts = [
        ("image", image("image/png", RED_PNG)),
        (
            "image_remote",
            json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
        ),
        (
            "audio",
            json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
        ),
        (
            "video",
            json!({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}),
        ),
        ("file", json!({"type": "file", "file": {"file_id": "f"}})),
        ("unknown", json!({"type": "hologram", "hologram": {}})),
        ("untyped", json!({"hologram": {}})),
    ];
    for mode in [
        ps_config::Mode::Rl,
        ps_config::Mode::Opd,
        ps_config::Mode::Combine,
    ] {
        for stream in [false, true] {
            let what = format!("mode {mode}, stream {stream}");
            let fake = vl_fake(None).await;
            let dir = tempfile::tempdir().unwrap();
            let mut s = vl_settings(&fake, dir.path());
            s.server.mode = mode;
            s.teacher.url = Some(fake.generate_url());
            s.teacher.timeout_sec = 5;
            s.teacher.images = true;
            let server = common::Server::start(&s, &common::no_env).await;
            for (kind, part) in &parts {
                let first = json!({"role": "user", "content": [text("Look at this:"), part]});
                let a = answer(
                    chat(
                        &server.url,
                        kind,
                        json!({"messages": [first], "stream": stream}),
                        false,
                    )
                    .await,
                    stream,
                )
                .await;
                let history =
                    json!([first, a, {"role": "user", "content": "Thanks! FAKE_VOTES=1"}]);
                let r = chat(
                    &server.url,
                    kind,
                    json!({"messages": history, "stream": stream}),
                    true,
                )
                .await;
                assert_eq!(r.status(), 200, "{what}: {kind} answered as sent");
                let _ = r.bytes().await;
            }
            let samples = server.resolved(2 * parts.len() as u64).await;
            let st = server.status().await;
            for sample in &samples {
                assert_eq!(
                    sample["session_id"], "image",
                    "{what}: only the captured image's session gives samples: {st}"
                );
                let images = sample["images"].as_array().unwrap();
                assert_eq!(images.len(), 1, "{what}");
                assert_eq!(images[0]["hash"], sha(RED_PNG), "{what}");
            }
            let reasons = &st["turns_abandoned_by_reason"];
            for reason in [
                "image_remote",
                "audio_unsupported",
                "video_unsupported",
                "file_unsupported",
            ] {
                assert_eq!(
                    reasons[reason], 2,
                    "{what}: both turns of its session: {reasons}"
                );
            }
            assert_eq!(reasons["content_part_unsupported"], 4, "{what}: {reasons}");
            match mode {
                // Turn 1 judged with its next state, turn 2 without one: both samples.
                ps_config::Mode::Rl => assert_eq!(samples.len(), 2, "{what}: {st}"),
                // Turn 1 distilled: the SGLang teacher scored the hinted prompt with its image
                // (image_data beside the ids, checked by the fake against the pad runs); turn 2
                // had no next state.
                _ => {
                    assert_eq!(samples.len(), 1, "{what}: {st}");
                    assert_eq!(samples[0]["metadata"]["teacher"], "hinted", "{what}");
                    let teacher = samples[0]["teacher_log_probs"].as_array().unwrap();
                    assert_eq!(
                        teacher.len() as u64,
                        samples[0]["response_length"].as_u64().unwrap(),
                        "{what}"
                    );
                    let calls: Vec<Value> = fake
                        .requests()
                        .into_iter()
                        .filter(|r| r.path == "/generate" && r.body.get("image_data").is_some())
                        .map(|r| r.body)
                        .collect();
                    assert_eq!(calls.len(), 1, "{what}: one teacher call with the image");
                    assert_eq!(
                        calls[0]["image_data"][0].as_str().unwrap(),
                        data_url("image/png", RED_PNG),
                        "{what}"
                    );
                }
            }
            server.stop().await;
        }
    }
}

/// A teacher that scores token ids only (an OpenAI-compatible `/v1/completions`, or an SGLang
/// teacher not declared a vision model, `teacher.images = false`, the default) gives an image
/// turn no teacher values: dropped as `teacher_without_images` in OPD, never scored without its
/// image; the hint judges are not asked first.
#[tokio::test]
async fn a_teacher_without_images_drops_image_turns_with_that_reason() {
    for completions in [true, false] {
        teacher_without_images(completions).await;
    }
}

async fn teacher_without_images(completions: bool) {
    let fake = vl_fake(None).await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = vl_settings(&fake, dir.path());
    s.server.mode = ps_config::Mode::Opd;
    if completions {
        s.teacher.backend = ps_config::TeacherBackend::OpenaiCompletions;
        s.teacher.url = Some(format!("{}/v1/completions", fake.base_url()));
        s.teacher.model = Some("default".into());
    } else {
        s.teacher.url = Some(fake.generate_url());
    }
    s.teacher.timeout_sec = 5;
    let server = common::Server::start(&s, &common::no_env).await;
    let first = json!({"role": "user", "content": [text("Look:"), image("image/png", RED_PNG)]});
    let a = answer(
        chat(&server.url, "ct", json!({"messages": [first]}), false).await,
        false,
    )
    .await;
    let history = json!([first, a, {"role": "user", "content": "Thanks! FAKE_VOTES=1"}]);
    answer(
        chat(&server.url, "ct", json!({"messages": history}), true).await,
        false,
    )
    .await;
    let samples = server.resolved(2).await;
    assert!(samples.is_empty());
    let st = server.status().await;
    assert_eq!(
        st["turns_dropped_by_reason"]["teacher_without_images"], 1,
        "{st}"
    );
    assert!(
        fake.requests()
            .iter()
            .all(|r| r.path != "/v1/completions" && r.path != "/generate"),
        "neither the teacher nor the hint judges were asked"
    );
    server.stop().await;
}

/// Two images of different sizes in one OPD turn: the teacher gets them in prompt order beside
/// ids whose pad runs fit each (the fake's `/generate` refuses runs that do not fit its images in
/// order), and the turn is distilled with the teacher's value at every response position.
#[tokio::test]
async fn an_opd_teacher_gets_several_images_in_prompt_order() {
    let fake = vl_fake(None).await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = vl_settings(&fake, dir.path());
    s.server.mode = ps_config::Mode::Opd;
    s.teacher.url = Some(fake.generate_url());
    s.teacher.timeout_sec = 5;
    s.teacher.images = true;
    let server = common::Server::start(&s, &common::no_env).await;
    let first = json!({"role": "user", "content": [
        image("image/jpeg", BLUE_JPG), text("and"), image("image/png", RED_PNG)]});
    let a = answer(
        chat(&server.url, "two", json!({"messages": [first]}), false).await,
        false,
    )
    .await;
    let history = json!([first, a, {"role": "user", "content": "Thanks! FAKE_VOTES=1"}]);
    answer(
        chat(&server.url, "two", json!({"messages": history}), true).await,
        false,
    )
    .await;
    let samples = server.resolved(2).await;
    assert_eq!(samples.len(), 1, "{}", server.status().await);
    let sample = &samples[0];
    assert_eq!(sample["metadata"]["teacher"], "hinted");
    let counts: Vec<u64> = sample["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(counts.len(), 2);
    assert_ne!(
        counts[0], counts[1],
        "images of different sizes: order matters"
    );
    let teacher: Vec<Value> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/generate" && r.body.get("image_data").is_some())
        .map(|r| r.body)
        .collect();
    assert_eq!(teacher.len(), 1);
    assert_eq!(
        teacher[0]["image_data"],
        json!([
            data_url("image/jpeg", BLUE_JPG),
            data_url("image/png", RED_PNG)
        ])
    );
    server.stop().await;
}
