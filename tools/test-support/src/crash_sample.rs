//! The deterministic sample number `n` of the crash test, shared by the test (`tests/store_crash.rs`) and its
//! child process (`src/bin/store-crash-writer.rs`).

use ps_core::sample::{Reward, Sample, SampleImage, SampleStatus};
use serde_json::json;

/// One of four images (20–23 kB, more than one chunk of the store), `k` in 0..4.
pub fn image(k: u64) -> SampleImage {
    let bytes: Vec<u8> = (0..20_000 + k as usize * 1000)
        .map(|i| (i as u64 * 31 + k) as u8)
        .collect();
    SampleImage {
        hash: format!("{:064x}", k + 1),
        mime: "image/png".into(),
        width: 100 + k,
        height: 50,
        tokens: 16,
        bytes: Some(bytes.into()),
    }
}

/// A sample whose every field derives from `n`, with a few hundred tokens; every third one
/// references one of four images (re-sent by many samples, as a conversation does).
pub fn sample(n: u64) -> Sample {
    let prompt_len = 200 + (n % 50) as usize;
    let response_len = 100 + (n % 97) as usize;
    let tokens: Vec<u32> = (0..prompt_len + response_len)
        .map(|i| ((n as usize).wrapping_mul(7919).wrapping_add(i * 104_729) % 151_000) as u32)
        .collect();
    let log_probs: Vec<f64> = (0..response_len)
        .map(|i| -((n as f64) * 0.001 + (i as f64) * 0.0137).sin().abs() - 1e-9)
        .collect();
    let mut metadata = serde_json::Map::new();
    metadata.insert("n".into(), json!(n));
    metadata.insert("model".into(), json!("policy-7b"));
    metadata.insert("ratio".into(), json!(n as f64 / 3.0));
    let tokens_len = tokens.len();
    Sample {
        images: if n.is_multiple_of(3) {
            vec![image(n % 4)]
        } else {
            Vec::new()
        },
        index: 0,
        group_index: 0,
        prompt: format!("prompt of sample {n} ").repeat(20),
        response: format!("response of sample {n} ").repeat(10),
        tokens,
        response_length: response_len,
        loss_mask: (0..response_len).map(|i| u8::from(i % 5 != 0)).collect(),
        rollout_log_probs: log_probs,
        reward: Reward {
            score: (n % 11) as f64 / 10.0,
        },
        status: SampleStatus::Completed,
        session_id: format!("crash-session-{}", n % 13),
        turn: n,
        weight_versions: Vec::new(),
        teacher_log_probs: None,
        teacher_topk_log_probs: None,
        teacher_topk_indices: None,
        // Every fifth sample has routed experts: their blocks are kept by the store as images
        // are, and must survive the crash with the sample.
        rollout_routed_experts: n
            .is_multiple_of(5)
            .then(|| {
                let rows = tokens_len.saturating_sub(1);
                let values: Vec<i32> = (0..rows * 4)
                    .map(|i| ((i as u64 * 7 + n) % 60) as i32)
                    .collect();
                let engine = ps_core::EngineExperts {
                    width: ps_core::ExpertWidth::Int32,
                    data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    shape: Some([rows, 2, 2]),
                    field: "crash".into(),
                };
                ps_core::ExpertRows::of_turn(&engine, tokens_len, None).ok()
            })
            .flatten()
            .map(|rows| ps_core::SampleExperts::of(&rows)),
        metadata,
    }
}
