//! Switches for the ways real SGLang builds differ (docs/upstream-protocols.md 1.3, 1.5, 1.6 and
//! 5), so that tests run across them instead of against one idealised server. The defaults
//! follow current SGLang with a reasoning parser.

/// Where a non-streamed answer puts the sampled ids it was asked for (`return_token_ids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdField {
    /// `choices[].response_token_ids` + `choices[].prompt_token_ids`: SGLang after its August 2026
    /// rename (PR #35225).
    #[default]
    ResponseTokenIds,
    /// `choices[].token_ids` + `choices[].prompt_token_ids`: SGLang between July and August 2026.
    TokenIds,
    /// vLLM: `choices[].token_ids` and the prompt ids at the response level.
    Vllm,
    /// `sglext.input_ids` / `sglext.output_ids` (server flag `--return-output-ids`): on every answer,
    /// streamed ones too (a final `choices: []` chunk before `[DONE]`), whatever the request asked.
    Sglext,
    /// A build before July 2026: `return_token_ids` is ignored, no ids come back.
    None,
}

/// How a streamed answer carries its log-probs (docs/upstream-protocols.md 1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamLogprobs {
    /// A parser active, builds after PR #28601 (mid-2026): a step's log-probs ride on its chunk, or
    /// on a standalone chunk with an empty `delta: {}` when the step emitted no text (markers, EOS).
    #[default]
    StepChunks,
    /// No reasoning/tool parser: a step whose text delta is empty sends no chunk, and its log-prob
    /// is lost (the EOS, the think markers and the whitespace around them).
    DropEmptyDeltas,
    /// A parser active, builds before PR #28601: reasoning and tool-call chunks carry
    /// `logprobs: null`, and a request with `tools` gets no log-probs at all.
    NullOnParsedChunks,
}

/// The build the fake behaves like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quirks {
    pub id_field: IdField,
    pub stream_logprobs: StreamLogprobs,
    /// Sampled tokens per streamed chunk (SGLang batches steps under load); every entry of a chunk
    /// repeats the first token's top list. Default 1.
    pub tokens_per_chunk: usize,
    /// `metadata.weight_version` of non-streamed answers (and `meta_info` of `/generate`); `None`
    /// leaves it out (builds before weight versions). Default `"default"`, as SGLang without
    /// `--weight-version`.
    pub weight_version: Option<String>,
    /// Top lists shorter than asked and missing the sampled token (ids that decode to the same text
    /// collapse; docs/upstream-protocols.md 1.6). Default false.
    pub short_top_lists: bool,
    /// Answers shaped as vLLM 0.32's (recorded from the real engine, docs/upstream-protocols.md
    /// "vLLM as the policy engine"): reasoning under `reasoning`, `stop_reason` instead of
    /// `matched_stop`, `owned_by: "vllm"` and no `/get_model_info`, and `return_token_ids`
    /// accepted on streams (the prompt's ids on the first chunk, each chunk's sampled ids on its
    /// choice, one sampled token and its log-prob per chunk). Default false ([`Quirks::vllm`]
    /// sets it with the ids and weight version vLLM gives).
    pub vllm: bool,
    /// A mixture-of-experts model served with `--enable-return-routed-experts`: SGLang answers
    /// `sglext.routed_experts` (base64 int32, no shape) to a request that asks
    /// (`return_routed_experts`), streamed in a final `choices: []` chunk, and reports the flag in
    /// `GET /get_server_info`; vLLM (`vllm`) answers every whole answer with
    /// `choices[0].routed_experts` (base64 `.npy`, uint8) and streams none. Default none (a dense
    /// model, or the flag off).
    pub routed_experts: Option<MoeRouting>,
}

/// The fake's mixture-of-experts routing: `layers` × `top_k` experts of `experts` per token.
/// Each token's experts are a function of its position and the tokens up to it only, as a real
/// causal model's, so a later turn routes its prompt's shared prefix exactly as the earlier turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeRouting {
    pub layers: usize,
    pub top_k: usize,
    pub experts: u32,
}

impl Default for MoeRouting {
    /// 4 layers, top-2 of 16 experts.
    fn default() -> Self {
        Self {
            layers: 4,
            top_k: 2,
            experts: 16,
        }
    }
}

impl MoeRouting {
    /// The experts of every token of `tokens` but the last, row-major (`rows × layers × top_k`).
    pub fn route(&self, tokens: &[u32]) -> Vec<u32> {
        let rows = tokens.len().saturating_sub(1);
        let mut out = Vec::with_capacity(rows * self.layers * self.top_k);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for (i, &t) in tokens.iter().take(rows).enumerate() {
            // The running state stands for the prefix: position i sees tokens 0..=i only.
            state = crate::det::mix(state, u64::from(t) ^ ((i as u64) << 32));
            for layer in 0..self.layers {
                for k in 0..self.top_k {
                    let h = crate::det::mix(state, ((layer as u64) << 16) | k as u64);
                    out.push((h % u64::from(self.experts.max(1))) as u32);
                }
            }
        }
        out
    }
}

impl Quirks {
    /// The real vLLM 0.32 (CPU build, with `--reasoning-parser qwen3` and the hermes tool parser).
    pub fn vllm() -> Self {
        Self {
            id_field: IdField::Vllm,
            stream_logprobs: StreamLogprobs::StepChunks,
            tokens_per_chunk: 1,
            weight_version: None,
            short_top_lists: false,
            vllm: true,
            routed_experts: None,
        }
    }
}

impl Default for Quirks {
    fn default() -> Self {
        Self {
            id_field: IdField::default(),
            stream_logprobs: StreamLogprobs::default(),
            tokens_per_chunk: 1,
            weight_version: Some("default".into()),
            short_top_lists: false,
            vllm: false,
            routed_experts: None,
        }
    }
}
