//! Sessions without headers (`server.session_inference`): conversations recognised from their own
//! history through the real server, in front of the in-process fake SGLang.
//!
//! Long because each matching rule (continue, fork, retry, compaction, side shapes, bounds) has its
//! own case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use common::{assemble_sse, settings, user};
use ps_config::{SessionInference, Settings, SideTurnRule};
use ps_fake_sglang::{FakeHandle, FakeSglang, Fault};
use serde_json::{Value, json};

struct Server {
    url: String,
    fake: FakeHandle,
    running: Option<ps_app::Running>,
    http: reqwest::Client,
}

async fn start(settings: Settings, fake: FakeHandle) -> Server {
    let running = common::spawn(&settings, &common::no_env).await;
    Server {
        url: running.url().to_owned(),
        fake,
        running: Some(running),
        http: common::http(),
    }
}

async fn fresh(tune: impl FnOnce(&mut Settings)) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSglang::builder().spawn().await.unwrap();
    let mut s = settings(&fake, dir.path());
    tune(&mut s);
    (start(s, fake).await, dir)
}

/// One answered request: the session the server chose and the assistant message.
struct Answer {
    status: u16,
    session: String,
    message: Value,
}

impl Server {
    async fn stop(mut self) {
        self.running.take().unwrap().stop().await.unwrap();
    }

    /// Sends `body` (plus `headers`); reads a JSON answer or assembles a streamed one.
    async fn send(&self, body: Value, headers: &[(&str, &str)]) -> Answer {
        let mut req = self
            .http
            .post(format!("{}/v1/chat/completions", self.url))
            .json(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let session = r
            .headers()
            .get("x-session-id")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        if status != 200 {
            return Answer {
                status,
                session,
                message: Value::Null,
            };
        }
        let message = if body["stream"] == true {
            assemble_sse(&r.text().await.unwrap())
        } else {
            r.json::<Value>().await.unwrap()["choices"][0]["message"].clone()
        };
        Answer {
            status,
            session,
            message,
        }
    }

    async fn status(&self) -> Value {
        self.http
            .get(format!("{}/v1/rollout/status", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn wait_submitted(&self, n: u64) -> Value {
        // Polls the status (scoring runs in the background); 40 s is far beyond what 64
        // conversations need even on a loaded 2-core machine.
        for _ in 0..1600 {
            let st = self.status().await;
            if st["samples"]["submitted"].as_u64().unwrap() >= n {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{n} samples were not submitted: {}", self.status().await);
    }

    /// Every stored sample.
    async fn samples(&self) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let page: Value = self
                .http
                .get(format!(
                    "{}/v1/rollout/samples?after={after}&max=100",
                    self.url
                ))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let items = page["samples"].as_array().unwrap();
            if items.is_empty() {
                return out;
            }
            for it in items {
                after = it["seq"].as_u64().unwrap();
                out.push(it["sample"].clone());
            }
        }
    }
}

fn system(text: &str) -> Value {
    json!({"role": "system", "content": text})
}

/// `convN` in a text: the conversation a message belongs to.
fn conv_of(text: &str) -> Option<usize> {
    let at = text.find("conv")?;
    let digits: String = text[at + 4..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).map_or(0, |i| i + start.len());
    let to = text[from..].find(end).map_or(text.len(), |i| from + i);
    &text[from..to]
}

const CONVERSATIONS: usize = 64;
const TURNS: usize = 4;

/// Tokens, reward and loss mask of one sample.
type Trained = (Vec<u64>, f64, Vec<u64>);

/// What one run produced, per (conversation, turn): tokens, reward, loss mask; with each sample's
/// session and source.
struct Run {
    by_turn: BTreeMap<(usize, u64), Trained>,
    sessions: HashMap<usize, HashSet<String>>,
    sources: HashSet<String>,
    /// (conversation of the judged response, conversation of its next state) per judge prompt.
    judged: Vec<(Option<usize>, Option<usize>)>,
}

/// 64 conversations, interleaved turn by turn (every conversation's turn t concurrently, then turn
/// t+1), half of them streamed; with or without session headers.
async fn run_conversations(with_headers: bool) -> Run {
    let (s, _dir) = fresh(|_| {}).await;
    let mut histories: Vec<Vec<Value>> = (0..CONVERSATIONS)
        .map(|i| {
            vec![
                system("You are a careful coding agent."),
                user(&format!("conv{i} step0 fix the failing test")),
            ]
        })
        .collect();
    for t in 0..TURNS {
        let sends = histories.iter().enumerate().map(|(i, h)| {
            let body = json!({"messages": h, "stream": i % 2 == 1});
            let id = format!("conv-{i}");
            let s = &s;
            async move {
                let headers: Vec<(&str, &str)> = if with_headers {
                    vec![("x-session-id", id.as_str())]
                } else {
                    Vec::new()
                };
                s.send(body, &headers).await
            }
        });
        let answers = futures::future::join_all(sends).await;
        for (i, a) in answers.into_iter().enumerate() {
            assert_eq!(a.status, 200);
            histories[i].push(a.message);
            histories[i].push(user(&format!("conv{i} step{} go on", t + 1)));
        }
    }
    // Every turn but the last has its next state: those become samples now.
    let n = (CONVERSATIONS * (TURNS - 1)) as u64;
    let st = s.wait_submitted(n).await;
    let samples = s.samples().await;
    assert_eq!(samples.len() as u64, n, "{st}");
    let mut run = Run {
        by_turn: BTreeMap::new(),
        sessions: HashMap::new(),
        sources: HashSet::new(),
        judged: Vec::new(),
    };
    let nums = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    for x in &samples {
        let conv = conv_of(x["prompt"].as_str().unwrap()).unwrap();
        let turn = x["turn"].as_u64().unwrap();
        let prev = run.by_turn.insert(
            (conv, turn),
            (
                nums(&x["tokens"]),
                x["reward"]["score"].as_f64().unwrap(),
                nums(&x["loss_mask"]),
            ),
        );
        assert!(
            prev.is_none(),
            "two samples of conversation {conv} turn {turn}"
        );
        run.sessions
            .entry(conv)
            .or_default()
            .insert(x["session_id"].as_str().unwrap().to_owned());
        run.sources
            .insert(x["metadata"]["session_source"].as_str().unwrap().to_owned());
    }
    for r in s.fake.requests() {
        if r.path != "/generate" {
            continue;
        }
        let prompt = r.body["text"].as_str().unwrap_or_default().to_owned();
        let response = between(
            &prompt,
            "=== Assistant response ===",
            "=== End of assistant",
        );
        let next = between(&prompt, "=== Next state", "=== End of next state");
        run.judged.push((conv_of(response), conv_of(next)));
    }
    s.stop().await;
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_conversations_without_keys_give_the_samples_of_the_same_traffic_with_headers() {
    let inferred = run_conversations(false).await;
    let keyed = run_conversations(true).await;

    assert_eq!(inferred.sources, HashSet::from(["inferred".to_owned()]));
    assert_eq!(keyed.sources, HashSet::from(["header".to_owned()]));
    // Each conversation is exactly one session, and no two share one.
    let mut all = HashSet::new();
    for conv in 0..CONVERSATIONS {
        let sessions = &inferred.sessions[&conv];
        assert_eq!(sessions.len(), 1, "conversation {conv}: {sessions:?}");
        let id = sessions.iter().next().unwrap();
        assert!(id.starts_with("inferred-"), "{id}");
        assert!(all.insert(id.clone()), "{id} shared");
    }
    // Every judged next state is its own conversation's next message.
    assert!(
        inferred.judged.len() >= CONVERSATIONS * (TURNS - 1),
        "{} judge prompts",
        inferred.judged.len()
    );
    for (response, next) in &inferred.judged {
        assert!(response.is_some(), "the response names its conversation");
        assert_eq!(response, next, "a next state from another conversation");
    }
    // Same tokens, rewards and masks as with headers.
    assert_eq!(inferred.by_turn.len(), keyed.by_turn.len());
    for (k, v) in &keyed.by_turn {
        assert_eq!(inferred.by_turn.get(k), Some(v), "conversation/turn {k:?}");
    }
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "run_tests", "description": "Run tests",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"},
            "verbose": {"type": "boolean"}}, "required": ["path"]}}}])
}

/// Our reply as a client sends it back: reasoning dropped, content as a one-part list, tool-call
/// arguments re-serialised with other spacing and key order.
fn resent(reply: &Value) -> Value {
    let mut m = json!({"role": "assistant",
        "content": [{"type": "text", "text": reply["content"].as_str().unwrap_or("")}]});
    if let Some(calls) = reply["tool_calls"].as_array() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let args: Value =
                    serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                let mut pairs: Vec<(String, Value)> = args
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                pairs.reverse();
                let body: Vec<String> = pairs
                    .iter()
                    .map(|(k, v)| format!("{} :  {}", json!(k), v))
                    .collect();
                json!({"id": c["id"], "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": format!("{{ {} }}", body.join(" , "))}})
            })
            .collect();
        m["tool_calls"] = json!(calls);
    }
    m
}

#[tokio::test]
async fn resent_histories_match_a_regenerate_forks_and_a_retry_does_not() {
    let (s, _dir) = fresh(|_| {}).await;
    let mut h = vec![
        system("You are an agent with tools."),
        user("conv1 run the tests in src [call_tool]"),
    ];
    let a1 = s.send(json!({"messages": h, "tools": tools()}), &[]).await;
    assert_eq!(a1.status, 200);
    assert!(
        a1.message["tool_calls"].is_array(),
        "the fake calls the tool: {}",
        a1.message
    );
    assert!(a1.message["reasoning_content"].is_string());
    let parent = a1.session.clone();
    h.push(resent(&a1.message));
    h.push(
        json!({"role": "tool", "tool_call_id": a1.message["tool_calls"][0]["id"],
        "content": "conv1 2 passed"}),
    );

    // The upstream fails: 502 to the client, and nothing registered.
    s.fake
        .push_fault(Fault::Status(500, Fault::status_body(500)));
    let failed = s.send(json!({"messages": h, "tools": tools()}), &[]).await;
    assert!(failed.status >= 500, "{}", failed.status);
    // The client's retry continues the same session: not a fork.
    let a2 = s
        .send(
            json!({"messages": h, "tools": tools(), "stream": true}),
            &[],
        )
        .await;
    assert_eq!(a2.status, 200);
    assert_eq!(a2.session, parent, "a retry is the same session");
    // Regenerate: the same history once more is a fork. (The fake answers the same messages the
    // same way; `tool_choice` makes this answer differ, as a sampled regenerate would.)
    let regen = s
        .send(
            json!({"messages": h, "tools": tools(), "tool_choice": "required"}),
            &[],
        )
        .await;
    assert_ne!(regen.message["tool_calls"], a2.message["tool_calls"]);
    assert_ne!(regen.session, parent);
    assert!(regen.session.starts_with("inferred-"));
    // Each branch goes on in its own session; both close with the body key.
    let mut main = h.clone();
    main.push(a2.message.clone());
    main.push(user("conv1 thanks, done"));
    let end = s
        .send(json!({"messages": main, "session_done": true}), &[])
        .await;
    assert_eq!(end.session, parent);
    let mut fork = h.clone();
    fork.push(resent(&regen.message));
    fork.push(user("conv1 other branch done"));
    let end = s
        .send(json!({"messages": fork, "session_done": true}), &[])
        .await;
    assert_eq!(end.session, regen.session);

    // parent: turns 1, 2 (failed, abandoned), 3, 4; fork: turns 1, 2.
    let st = s.wait_submitted(5).await;
    let inf = &st["session_inference"];
    assert_eq!(inf["mode"], "when_missing");
    assert_eq!(inf["forks"], 1, "{inf}");
    assert_eq!(inf["unmatched_continuations"], 0, "{inf}");
    assert_eq!(inf["inferred_sessions"], 1, "{inf}");
    let samples = s.samples().await;
    let of = |sid: &str| -> Vec<&Value> {
        samples
            .iter()
            .filter(|x| x["session_id"] == sid)
            .collect::<Vec<_>>()
    };
    let p = of(&parent);
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(
        p.iter()
            .all(|x| x["metadata"]["session_source"] == "inferred")
    );
    // The parent's first turn was judged with the first continuation (the tool result), and had
    // a next state.
    assert_ne!(p[0]["metadata"]["excluded"], "no_next_state");
    let f = of(&regen.session);
    assert_eq!(f.len(), 2, "{f:?}");
    for x in &f {
        assert_eq!(x["metadata"]["session_source"], "fork");
        assert_eq!(x["metadata"]["parent_session"], json!(parent));
    }
    s.stop().await;
}

#[tokio::test]
async fn a_compacted_history_starts_a_linked_session_and_a_subagent_its_own() {
    let (s, _dir) = fresh(|_| {}).await;
    let opening = vec![
        system("You are a coding agent."),
        user("conv2 refactor the parser"),
    ];
    let a1 = s.send(json!({"messages": opening}), &[]).await;
    let first = a1.session.clone();
    // The agent summarised its history: our reply is gone.
    let mut compacted = opening.clone();
    compacted.push(json!({"role": "assistant", "content": "Summary: parser split in two."}));
    compacted.push(user("conv2 continue"));
    let c = s
        .send(json!({"messages": compacted, "session_done": true}), &[])
        .await;
    assert_ne!(c.session, first);
    // A subagent with its own system prompt and the same task is its own, unlinked session.
    let sub = s
        .send(
            json!({"messages": [system("You are a search subagent."), user("conv2 refactor the parser")],
                "session_done": true}),
            &[],
        )
        .await;
    assert!(sub.session != first && sub.session != c.session);
    s.wait_submitted(2).await;
    let samples = s.samples().await;
    let linked = samples
        .iter()
        .find(|x| x["session_id"] == json!(c.session))
        .unwrap();
    assert_eq!(linked["metadata"]["session_source"], "inferred");
    assert_eq!(linked["metadata"]["continued_from"], json!(first));
    let subagent = samples
        .iter()
        .find(|x| x["session_id"] == json!(sub.session))
        .unwrap();
    assert!(subagent["metadata"].get("continued_from").is_none());
    let inf = &s.status().await["session_inference"];
    assert_eq!(inf["unmatched_continuations"], 1, "{inf}");
    assert_eq!(inf["continued_from_links"], 1, "{inf}");
    s.stop().await;
}

#[tokio::test]
async fn keys_win_when_missing_always_ignores_them_and_off_shares_unknown() {
    let msgs = json!([user("conv3 hello")]);
    let (s, _dir) = fresh(|_| {}).await;
    let a = s
        .send(json!({"messages": msgs}), &[("x-session-id", "mine")])
        .await;
    assert_eq!(a.session, "mine");
    let b = s
        .send(json!({"messages": msgs, "session_id": "body-id"}), &[])
        .await;
    assert_eq!(b.session, "body-id");
    s.stop().await;

    let (s, _dir) = fresh(|c| c.server.session_inference = SessionInference::Always).await;
    let a = s
        .send(json!({"messages": msgs}), &[("x-session-id", "mine")])
        .await;
    assert!(a.session.starts_with("inferred-"), "{}", a.session);
    s.stop().await;

    let (s, _dir) = fresh(|c| c.server.session_inference = SessionInference::Off).await;
    let a = s.send(json!({"messages": msgs}), &[]).await;
    assert_eq!(a.session, "unknown");
    let st = s.status().await;
    assert_eq!(st["session_inference"]["mode"], "off");
    s.stop().await;
}

#[tokio::test]
async fn a_side_turn_rule_keeps_helper_requests_out_of_the_conversation() {
    let (s, _dir) = fresh(|c| {
        c.server.side_turn_rules = vec![SideTurnRule {
            name: "title".into(),
            last_user_prefix: Some("### Task:".into()),
            without_tools: true,
            ..SideTurnRule::default()
        }];
    })
    .await;
    let h = vec![user("conv4 write a parser")];
    let a1 = s.send(json!({"messages": h}), &[]).await;
    // The agent asks for a title: a side turn, not a session of its own nor a turn of this one.
    let title = s
        .send(
            json!({"messages": [user("### Task:\nGenerate a concise title for: conv4 write a parser")]}),
            &[],
        )
        .await;
    assert_eq!(title.status, 200);
    assert_eq!(title.session, "unknown");
    let mut h2 = h.clone();
    h2.push(a1.message.clone());
    h2.push(user("conv4 now test it"));
    let a2 = s
        .send(json!({"messages": h2, "session_done": true}), &[])
        .await;
    assert_eq!(a2.session, a1.session);
    let st = s.wait_submitted(2).await;
    assert_eq!(st["session_inference"]["inferred_sessions"], 1);
    let samples = s.samples().await;
    assert_eq!(samples.len(), 2, "the title request is no sample");
    s.stop().await;
}

/// An agent's helper requests to its "small fast model" (Claude Code's title requests, which carry
/// the conversation's own session key): side turns by the model they name, no sample and no turn
/// of the conversation, whose next state stays the next main turn's.
#[tokio::test]
async fn a_side_turn_rule_on_the_model_keeps_a_keyed_helper_request_out_of_its_session() {
    let (s, _dir) = fresh(|c| {
        c.server.side_turn_rules = vec![SideTurnRule {
            name: "small_fast_model".into(),
            model: Some("small-fast".into()),
            ..SideTurnRule::default()
        }];
    })
    .await;
    let key = [("x-session-id", "conv7")];
    let h = vec![user("conv7 write a parser")];
    let a1 = s.send(json!({"messages": h}), &key).await;
    let title = s
        .send(
            json!({"model": "small-fast", "messages": [user("Write a title for: conv7 write a parser")]}),
            &key,
        )
        .await;
    assert_eq!(title.status, 200);
    let mut h2 = h.clone();
    h2.push(a1.message.clone());
    h2.push(user("conv7 now test it"));
    let a2 = s
        .send(json!({"messages": h2, "session_done": true}), &key)
        .await;
    assert_eq!(
        (a1.session.as_str(), a2.session.as_str()),
        ("conv7", "conv7")
    );
    s.wait_submitted(2).await;
    let samples = s.samples().await;
    assert_eq!(samples.len(), 2, "the helper request is no sample");
    let texts: Vec<String> = samples.iter().map(|x| x["prompt"].to_string()).collect();
    assert!(
        texts.iter().all(|t| !t.contains("Write a title")),
        "no sample holds the helper request: {texts:?}"
    );
    s.stop().await;
}

/// `server.model_names`: an agent's own model names are served under the policy's (listed by
/// `/v1/models`, renamed upstream, trained as any turn); any other name is a 404 in OpenAI's shape
/// that names the settings, and leaves no turn behind.
#[tokio::test]
async fn model_names_serve_an_agents_names_and_refuse_others_with_a_404() {
    let (s, _dir) = fresh(|c| {
        c.server.model_names = [("claude-sonnet-4-5".to_owned(), "default".to_owned())].into();
    })
    .await;
    let models: Value = s
        .http
        .get(format!("{}/v1/models", s.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["default", "claude-sonnet-4-5"]);
    // Refused before anything else: while submission is paused (a 503 for any request served
    // here), an unknown model is still a 404.
    let pause = s
        .http
        .post(format!("{}/v1/rollout/pause", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(pause.status().as_u16(), 200);
    let refused = s
        .http
        .post(format!("{}/v1/chat/completions", s.url))
        .header("x-session-id", "conv8")
        .json(&json!({"model": "gpt-5", "messages": [user("conv8 hello")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 404);
    let err: Value = refused.json().await.unwrap();
    assert_eq!(err["error"]["code"], "model_not_found", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("server.model_names"), "{message}");
    let resume = s
        .http
        .post(format!("{}/v1/rollout/resume", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resume.status().as_u16(), 200);
    // The engine is asked for the policy's name (the fake answers with the name it was asked for).
    let probe: Value = s
        .http
        .post(format!("{}/v1/chat/completions", s.url))
        .header("x-turn-type", "side")
        .json(&json!({"model": "claude-sonnet-4-5", "messages": [user("probe")]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(probe["model"], "default", "{probe}");
    let key = [("x-session-id", "conv9"), ("x-turn-type", "main")];
    let h = vec![user("conv9 write a parser")];
    let a1 = s
        .send(json!({"model": "claude-sonnet-4-5", "messages": h}), &key)
        .await;
    assert_eq!(a1.status, 200);
    let mut h2 = h.clone();
    h2.push(a1.message.clone());
    h2.push(user("conv9 now test it"));
    let a2 = s
        .send(
            json!({"model": "claude-sonnet-4-5", "messages": h2, "session_done": true}),
            &key,
        )
        .await;
    assert_eq!(a2.status, 200);
    s.wait_submitted(2).await;
    let samples = s.samples().await;
    assert_eq!(samples.len(), 2, "the refused request left no turn behind");
    s.stop().await;
}

/// While the trainer has paused submission (`pause_mode = "serve"`) turns are answered but not
/// captured; the conversation must still be recognised after the resume, streamed or not.
#[tokio::test]
async fn conversations_served_while_paused_are_still_recognised_after_the_resume() {
    let (s, _dir) = fresh(|c| c.server.pause_mode = ps_config::PauseMode::Serve).await;
    let pause = s
        .http
        .post(format!("{}/v1/rollout/pause", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(pause.status(), 200);
    let mut streamed = vec![user("conv5 streamed while paused")];
    let mut whole = vec![user("conv6 answered whole while paused")];
    let a = s
        .send(json!({"messages": streamed, "stream": true}), &[])
        .await;
    let b = s.send(json!({"messages": whole}), &[]).await;
    assert!(a.session.starts_with("inferred-") && b.session.starts_with("inferred-"));
    let resume = s
        .http
        .post(format!("{}/v1/rollout/resume", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resume.status(), 200);
    streamed.extend([a.message.clone(), user("conv5 after the resume")]);
    whole.extend([b.message.clone(), user("conv6 after the resume")]);
    let a2 = s
        .send(json!({"messages": streamed, "session_done": true}), &[])
        .await;
    let b2 = s
        .send(json!({"messages": whole, "session_done": true}), &[])
        .await;
    assert_eq!(a2.session, a.session);
    assert_eq!(b2.session, b.session);
    // The client ended them: a further continuation is a history that matches nothing.
    streamed.extend([a2.message.clone(), user("conv5 once more")]);
    let a3 = s.send(json!({"messages": streamed}), &[]).await;
    assert_ne!(a3.session, a.session);
    let inf = &s.status().await["session_inference"];
    assert_eq!(inf["continued"], 2, "{inf}");
    assert_eq!(inf["unmatched_continuations"], 1, "{inf}");
    s.stop().await;
}

/// A stream that carries SGLang's error event after its first chunks reached the client is a
/// failure the client retries: the retry continues the session, it is not a fork.
#[tokio::test]
async fn a_retry_after_an_error_event_mid_stream_is_not_a_fork() {
    let (s, _dir) = fresh(|_| {}).await;
    let mut h = vec![user("conv7 start")];
    let a1 = s.send(json!({"messages": h}), &[]).await;
    h.extend([a1.message.clone(), user("conv7 next")]);
    s.fake.push_fault(Fault::StreamError { after_chunks: 2 });
    let broken = s.send(json!({"messages": h, "stream": true}), &[]).await;
    assert_eq!(broken.status, 200, "the error comes inside the stream");
    assert_eq!(broken.session, a1.session);
    let retry = s.send(json!({"messages": h, "stream": true}), &[]).await;
    assert_eq!(retry.session, a1.session, "the retry is the same session");
    let inf = &s.status().await["session_inference"];
    assert_eq!(inf["forks"], 0, "{inf}");
    assert_eq!(inf["continued"], 2, "{inf}");
    s.stop().await;
}

/// A conversation's fingerprints go with its session: when the session buffer closes an idle
/// session, the matcher forgets it at once (no request needs to arrive and run the matcher's own
/// idle clock, whose `expired` count stays 0).
#[tokio::test]
async fn the_matcher_forgets_a_conversation_when_the_buffer_closes_its_session() {
    // Long enough that the session is still live when the status is read right after its answer on
    // a loaded machine (1 s was not), short enough for the test to wait it out.
    let (s, _dir) = fresh(|c| c.server.session_timeout_sec = 4).await;
    // The session's idle clock starts when the request arrives: timed from before it is sent.
    let asked = std::time::Instant::now();
    let a = s
        .send(json!({"messages": [user("conv9 start")]}), &[])
        .await;
    assert!(a.session.starts_with("inferred-"), "{}", a.session);
    let live = s.status().await["session_inference"]["live_sessions"].clone();
    if asked.elapsed() < Duration::from_secs(4) {
        assert_eq!(live, 1);
    }
    // The buffer's sweeper closes the session once it has been idle for the timeout; bounded wait.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let inf = loop {
        let inf = s.status().await["session_inference"].clone();
        if inf["live_sessions"] == 0 || std::time::Instant::now() > deadline {
            break inf;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        inf["live_sessions"], 0,
        "the closed session is forgotten: {inf}"
    );
    assert_eq!(inf["answered_ends"], 0, "{inf}");
    assert_eq!(
        inf["expired"], 0,
        "forgotten on the buffer's word, not by its own clock: {inf}"
    );
    s.stop().await;
}
