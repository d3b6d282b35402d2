//! Routed experts of a mixture-of-experts policy through the server (issue 34): asked of SGLang
//! when it says it returns them, read from whole and streamed answers (SGLang) and from whole
//! vLLM answers, checked against the sample's tokens, stored as blocks kept once per hash, and
//! delivered through the rollout API byte for byte; `require` drops turns without them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use ps_config::{Mode, Settings};
use ps_core::RoutedExpertsMode;
use ps_fake_sglang::{FakeHandle, FakeSglang, IdField, MINI_MODEL_DIR, MoeRouting, Quirks};
use serde_json::{Value, json};

use crate::common::{self, Server, http, settings, user};

/// The mini model with a mixture-of-experts `config.json` beside it (`layers` × top-`top_k`).
fn moe_model_dir(dir: &Path, layers: usize, top_k: usize) -> PathBuf {
    let model = dir.join("moe-model");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(Path::new(MINI_MODEL_DIR).join(f), model.join(f)).unwrap();
    }
    std::fs::write(
        model.join("config.json"),
        json!({"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": layers,
               "num_experts_per_tok": top_k, "num_experts": 16})
        .to_string(),
    )
    .unwrap();
    model
}

struct Rig {
    server: Server,
    fake: FakeHandle,
    _dir: tempfile::TempDir,
}

async fn rig(quirks: Quirks, tune: impl FnOnce(&mut Settings, &Path)) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().quirks(quirks).spawn().await.unwrap();
    let mut s = settings(&fake, &dir.path().join("store"));
    s.server.model_dir = Some(moe_model_dir(dir.path(), 4, 2));
    tune(&mut s, dir.path());
    Rig {
        server: Server::start(&s, &common::no_env).await,
        fake,
        _dir: dir,
    }
}

fn sglang_moe() -> Quirks {
    Quirks {
        routed_experts: Some(MoeRouting::default()),
        // Streamed turns carry the engine's ids too (`--return-output-ids`), so that their rows
        // are the engine's.
        id_field: IdField::Sglext,
        ..Quirks::default()
    }
}

/// `turns` turns of `session` (the last ends it), streamed or not; the number of main turns.
async fn conversation(s: &Server, session: &str, turns: usize, stream: bool) {
    let mut history = Vec::new();
    for i in 0..turns {
        history.push(user(&format!("step {i} of the plan: what next?")));
        let r = http()
            .post(format!("{}/v1/chat/completions", s.url))
            .header("x-session-id", session)
            .header("x-session-done", if i + 1 == turns { "1" } else { "0" })
            .json(&json!({"messages": history, "stream": stream}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let message = if stream {
            let text = r.text().await.unwrap();
            // The experts we asked for never reach the client.
            assert!(!text.contains("routed_experts"), "{text}");
            common::assemble_sse(&text)
        } else {
            let v: Value = r.json().await.unwrap();
            assert!(
                v.get("sglext")
                    .is_none_or(|x| x.get("routed_experts").is_none()),
                "{v}"
            );
            v["choices"][0]["message"].clone()
        };
        history.push(json!({"role": "assistant", "content": message["content"]}));
    }
}

/// A block's bytes through `GET /v1/rollout/blobs/{hash}`.
async fn blob(url: &str, hash: &str) -> Vec<u8> {
    let r = http()
        .get(format!("{url}/v1/rollout/blobs/{hash}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{hash}");
    r.bytes().await.unwrap().to_vec()
}

fn tokens(sample: &Value) -> Vec<u32> {
    sample["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Checks every sample's experts against the engine's routing of its tokens, fetching blocks by
/// hash; returns the distinct blocks' bytes and the sum of the samples' experts bytes.
async fn check_samples(url: &str, samples: &[Value], routing: &MoeRouting) -> (usize, usize) {
    let mut kept: HashMap<String, Vec<u8>> = HashMap::new();
    let mut naive = 0;
    for sample in samples {
        let e = &sample["rollout_routed_experts"];
        let ids = tokens(sample);
        assert_eq!(
            e["shape"],
            json!([ids.len() - 1, routing.layers, routing.top_k]),
            "{e}"
        );
        assert_eq!(e["dtype"], "uint8");
        assert_eq!(e["start_len"], 0);
        let mut bytes = Vec::new();
        for h in e["blocks"].as_array().unwrap() {
            let h = h.as_str().unwrap();
            if !kept.contains_key(h) {
                kept.insert(h.to_owned(), blob(url, h).await);
            }
            bytes.extend_from_slice(&kept[h]);
        }
        let want: Vec<u8> = routing.route(&ids).iter().map(|&x| x as u8).collect();
        assert_eq!(
            bytes, want,
            "the engine's routing of the sample's very tokens"
        );
        naive += want.len();
    }
    (kept.values().map(Vec::len).sum(), naive)
}

/// SGLang, whole and streamed, in RL, OPD and Combine: asked for experts (it reports the flag),
/// every sample carries its tokens' routing exactly, and the client never sees them.
#[tokio::test]
async fn sglang_experts_reach_every_kind_of_sample() {
    for mode in [Mode::Rl, Mode::Opd, Mode::Combine] {
        for stream in [false, true] {
            let r = rig(sglang_moe(), |s, dir| {
                s.server.mode = mode;
                if mode != Mode::Rl {
                    s.teacher.url = Some(s.prm.router_url.clone());
                    s.logging.opd_record_dir = Some(dir.join("opd"));
                }
            })
            .await;
            let session = format!("{mode:?}-{stream}");
            conversation(&r.server, &session, 3, stream).await;
            let samples = r.server.settle(3).await;
            assert!(!samples.is_empty(), "{mode:?}");
            check_samples(&r.server.url, &samples, &MoeRouting::default()).await;
            let chats: Vec<Value> = r
                .fake
                .requests()
                .into_iter()
                .filter(|q| q.path == "/v1/chat/completions")
                .map(|q| q.body)
                .collect();
            assert!(chats.iter().all(|b| b["return_routed_experts"] == true));
            let st = r.server.status().await;
            assert_eq!(st["routed_experts"]["captured"], 3, "{st}");
            assert_eq!(
                st["routed_experts"]["model_shape"],
                json!({"layers": 4, "top_k": 2, "experts": 16})
            );
            r.server.stop().await;
        }
    }
}

/// vLLM returns experts unasked on whole answers (a `.npy` with its shape) and none on streamed
/// ones: whole turns carry them; a streamed turn after them is marked and counted, not dropped
/// (`auto`), and no request asked vLLM for them.
#[tokio::test]
async fn vllm_experts_from_whole_answers_and_streamed_turns_are_marked() {
    let quirks = Quirks {
        routed_experts: Some(MoeRouting::default()),
        ..Quirks::vllm()
    };
    let r = rig(quirks, |s, _| {
        s.sglang.engine = ps_core::EngineSetting::Vllm
    })
    .await;
    conversation(&r.server, "whole", 3, false).await;
    let samples = r.server.settle(3).await;
    check_samples(&r.server.url, &samples, &MoeRouting::default()).await;
    conversation(&r.server, "streamed", 2, true).await;
    let samples = r.server.settle(5).await;
    let streamed: Vec<&Value> = samples
        .iter()
        .filter(|x| x["session_id"] == "streamed")
        .collect();
    assert_eq!(streamed.len(), 2);
    for x in streamed {
        assert!(x.get("rollout_routed_experts").is_none(), "{x}");
        assert_eq!(
            x["metadata"]["routed_experts_missing"],
            "routed_experts_missing"
        );
    }
    let st = r.server.status().await;
    assert_eq!(st["routed_experts"]["captured"], 3, "{st}");
    assert_eq!(st["routed_experts"]["missing"], 2, "{st}");
    assert!(
        r.fake
            .requests()
            .iter()
            .all(|q| q.body.get("return_routed_experts").is_none())
    );
    r.server.stop().await;
}

/// `require`: an engine that returns no experts, or experts that do not fit the model's shape,
/// gives no sample, with the reason counted; the client's answers are unaffected.
#[tokio::test]
async fn require_drops_turns_without_fitting_experts() {
    // A dense SGLang (no flag): asked anyway under `require`, answers without them.
    let r = rig(Quirks::default(), |s, _| {
        s.capture.routed_experts = RoutedExpertsMode::Require;
    })
    .await;
    conversation(&r.server, "dense", 2, false).await;
    let st = r.server.status_when(|st| common::accounted(st) >= 2).await;
    assert_eq!(
        st["turns_abandoned_by_reason"]["routed_experts_missing"], 2,
        "{st}"
    );
    assert_eq!(st["samples"]["submitted"], 0);
    r.server.stop().await;
    // The model says 3 layers × top-2 but the engine routes 4 × 2.
    let r = rig(sglang_moe(), |s, dir| {
        s.capture.routed_experts = RoutedExpertsMode::Require;
        s.server.model_dir = Some(moe_model_dir(&dir.join("three"), 3, 2));
    })
    .await;
    conversation(&r.server, "misfit", 2, false).await;
    let st = r.server.status_when(|st| common::accounted(st) >= 2).await;
    assert_eq!(
        st["turns_abandoned_by_reason"]["routed_experts_mismatch"], 2,
        "{st}"
    );
    assert!(
        st["routed_experts"]["last_mismatch"]
            .as_str()
            .unwrap()
            .contains("3 layers × top-2"),
        "{st}"
    );
    r.server.stop().await;
    // `off`: never asked, never kept.
    let r = rig(sglang_moe(), |s, _| {
        s.capture.routed_experts = RoutedExpertsMode::Off;
    })
    .await;
    conversation(&r.server, "off", 2, false).await;
    let samples = r.server.settle(2).await;
    assert!(
        samples
            .iter()
            .all(|x| x.get("rollout_routed_experts").is_none())
    );
    assert!(
        r.fake
            .requests()
            .iter()
            .all(|q| q.body.get("return_routed_experts").is_none())
    );
    r.server.stop().await;
}

/// A 20-turn conversation: every sample carries all its rows, yet the store keeps each block of
/// the positions the turns share once. The MessagePack page carries the blocks inline, and they
/// assemble to the same bytes.
#[tokio::test]
async fn a_long_conversation_stores_each_position_once() {
    let r = rig(sglang_moe(), |_, _| {}).await;
    conversation(&r.server, "long", 20, false).await;
    let samples = r.server.settle(20).await;
    assert_eq!(samples.len(), 20);
    let (kept, naive) = check_samples(&r.server.url, &samples, &MoeRouting::default()).await;
    let last = samples.last().unwrap();
    let last_bytes = (tokens(last).len() - 1) * 8;
    // Each turn adds its new rows and at most one partial block of 256 rows (8 bytes a row).
    assert!(
        kept <= last_bytes + 20 * 256 * 8,
        "kept {kept} bytes for {naive} bytes of rows"
    );
    assert!(kept * 2 < naive, "kept {kept} of {naive}");
    let distinct: HashSet<&str> = samples
        .iter()
        .flat_map(|x| x["rollout_routed_experts"]["blocks"].as_array().unwrap())
        .map(|h| h.as_str().unwrap())
        .collect();
    println!(
        "20 turns: {naive} bytes of rows in samples, {kept} bytes in {} blocks kept",
        distinct.len()
    );
    // MessagePack: the page carries every block once under `images`.
    let bytes = http()
        .get(format!(
            "{}/v1/rollout/samples?after=0&max=100&format=msgpack",
            r.server.url
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    #[derive(serde::Deserialize)]
    struct Page {
        samples: Vec<ps_core::StoredSample>,
        images: HashMap<String, serde_bytes::ByteBuf>,
    }
    // The inspection page shows each response token's experts per layer.
    let view: Value = http()
        .get(format!("{}/v1/inspect/samples/3", r.server.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids = tokens(&samples[2]);
    let prompt_len = view["prompt_tokens"].as_u64().unwrap() as usize;
    let routed = MoeRouting::default().route(&ids);
    let row = |r: usize| -> Value {
        json!(
            routed[r * 8..(r + 1) * 8]
                .chunks(2)
                .map(|l| l.to_vec())
                .collect::<Vec<_>>()
        )
    };
    assert_eq!(
        view["tokens"][0]["experts"],
        row(prompt_len),
        "{}",
        view["tokens"][0]
    );
    let last = view["tokens"].as_array().unwrap().last().unwrap();
    assert!(
        last.get("experts").is_none(),
        "the last token was never routed"
    );
    let page: Page = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(page.images.len(), distinct.len());
    for (stored, json) in page.samples.iter().zip(&samples) {
        let e = stored.sample.rollout_routed_experts.as_ref().unwrap();
        let joined = e
            .assemble(|h| page.images.get(h).map(|b| b.to_vec().into()))
            .unwrap();
        let want: Vec<u8> = MoeRouting::default()
            .route(&tokens(json))
            .iter()
            .map(|&x| x as u8)
            .collect();
        assert_eq!(joined, want);
    }
    r.server.stop().await;
}

/// An answer that the experts we asked for make larger than `sglang.max_answer_mib` is asked
/// again without them: the client gets its answer, the turn is captured without experts and
/// counted missing.
#[tokio::test]
async fn an_answer_too_large_with_experts_is_asked_again_without_them() {
    let routing = MoeRouting {
        layers: 64,
        top_k: 8,
        experts: 16,
    };
    let quirks = Quirks {
        routed_experts: Some(routing),
        ..Quirks::default()
    };
    let r = rig(quirks, |s, dir| {
        s.sglang.max_answer_mib = 1;
        s.server.model_dir = Some(moe_model_dir(&dir.join("wide"), 64, 8));
    })
    .await;
    // ~2.7 kB of base64 a token: a prompt of some 500 tokens passes 1 MiB.
    let long = "plan the next step of the trip with care ".repeat(100);
    let answer = r.server.chat("big", json!([user(&long)]), true).await;
    assert!(answer["choices"][0]["message"].is_object(), "{answer}");
    let st = r.server.status_when(|st| common::accounted(st) >= 1).await;
    assert_eq!(st["routed_experts"]["missing"], 1, "{st}");
    assert_eq!(st["samples"]["submitted"], 1, "{st}");
    let asks: Vec<bool> = r
        .fake
        .requests()
        .into_iter()
        .filter(|q| q.path == "/v1/chat/completions")
        .map(|q| q.body.get("return_routed_experts").is_some())
        .collect();
    assert_eq!(asks, [true, false]);
    r.server.stop().await;
}
