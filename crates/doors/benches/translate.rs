//! What a door's translation costs per request, beside a yardstick measured in the same run: one
//! tree parse of the chat body it makes (the cheapest thing the proxy could do with a request).
//! The loadgen's chat workload in each door's shape: a 1.6 kB system prompt, five turns of ~60-word
//! replies with reasoning. `cargo bench -p ps-doors --bench translate`.

use std::hint::black_box;
use std::time::Instant;

use serde_json::{Value, json};

fn time(label: &str, n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    println!("{label:<44} {us:>8.2} µs");
    us
}

fn main() {
    let system = "You are a careful assistant. ".repeat(55);
    let reply = "Here is what I found in the code base, step by step. ".repeat(6);
    let reasoning = "The user asks about the module layout; I should look first. ".repeat(3);
    let sig = ps_doors::messages::thinking_signature(&reasoning);
    let mut m_msgs = Vec::new();
    let mut r_items = Vec::new();
    for t in 0..5 {
        let ask = format!("Step {t}: now look at the session buffer and explain it.");
        m_msgs.push(json!({"role": "user", "content": ask}));
        r_items.push(json!({"role": "user", "content": ask}));
        if t < 4 {
            m_msgs.push(json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": reasoning, "signature": sig},
                {"type": "text", "text": reply}]}));
            r_items.push(json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [], "content": null, "encrypted_content": sig}));
            r_items.push(json!({"type": "message", "id": format!("msg_{t}"), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": reply, "annotations": []}]}));
        }
    }
    let messages = json!({"model": "default", "system": system, "max_tokens": 512, "temperature": 0.7, "messages": m_msgs}).to_string();
    let responses = json!({"model": "default", "instructions": system, "input": r_items, "max_output_tokens": 512,
        "temperature": 0.7, "store": false, "include": ["reasoning.encrypted_content"]}).to_string();
    let answer = json!({"id": "chatcmpl-1", "created": 1, "object": "chat.completion", "model": "default", "session_id": "s",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply, "reasoning_content": reasoning, "tool_calls": null}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 120}}).to_string();
    let n = 20_000;
    let chat_body = ps_doors::messages::to_chat(messages.as_bytes())
        .map(|t| t.body)
        .unwrap_or_default();
    println!(
        "request {} / {} bytes, chat body {} bytes",
        messages.len(),
        responses.len(),
        chat_body.len()
    );
    let yard = time("yardstick: one tree parse of the chat body", n, || {
        black_box(serde_json::from_slice::<Value>(&chat_body).ok());
    });
    let m_req = time("messages: request", n, || {
        black_box(ps_doors::messages::to_chat(messages.as_bytes()).ok());
    });
    let m_ans = time("messages: answer", n, || {
        black_box(ps_doors::messages::message_from_chat(answer.as_bytes(), "default", false).ok());
    });
    let cx = ps_doors::responses::ResponseContext {
        model: "default".into(),
        namespaces: Default::default(),
        encrypted_reasoning: true,
        echo: json!({"instructions": null, "metadata": {}, "tool_choice": "auto", "parallel_tool_calls": true,
            "temperature": 0.7, "top_p": null, "max_output_tokens": 512}),
    };
    let r_req = time("responses: request", n, || {
        black_box(ps_doors::responses::to_chat(responses.as_bytes(), None).ok());
    });
    let r_ans = time("responses: answer", n, || {
        black_box(ps_doors::responses::response_from_chat(answer.as_bytes(), &cx, false).ok());
    });
    println!(
        "per request, against the yardstick: messages {:.2} x, responses {:.2} x",
        (m_req + m_ans) / yard,
        (r_req + r_ans) / yard
    );
}
