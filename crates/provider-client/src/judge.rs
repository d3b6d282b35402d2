//! [`ProviderJudge`]: the judge transport port ([`JudgeBackend`]) over a provider's chat endpoint.

use std::sync::Arc;

use async_trait::async_trait;
use ps_core::ports::{CallError, JudgeBackend};
use serde_json::Value;

use crate::ProviderClient;

/// The reason of a judge call through a provider that failed.
pub const JUDGE_PROVIDER: &str = "judge_provider";

/// A [`JudgeBackend`] (PRM or hint judge) asking `model` through a shared [`ProviderClient`]. The
/// answer is the message `content`, or the reasoning when the content is null or blank; a call that
/// fails gives a [`CallError`] (reason [`JUDGE_PROVIDER`]) whose message names the provider, its
/// URL and, for a rejected key, the variable (so the failed vote's reason says what to fix).
#[derive(Debug, Clone)]
pub struct ProviderJudge {
    client: Arc<ProviderClient>,
    model: String,
    max_tokens: Option<u32>,
    temperature: Option<f64>,
}

impl ProviderJudge {
    /// `max_tokens` and `temperature` are sent only when given (some reasoning models reject them).
    pub fn new(
        client: Arc<ProviderClient>,
        model: impl Into<String>,
        max_tokens: Option<u32>,
        temperature: Option<f64>,
    ) -> Self {
        Self {
            client,
            model: model.into(),
            max_tokens,
            temperature,
        }
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn client(&self) -> &Arc<ProviderClient> {
        &self.client
    }
}

#[async_trait]
impl JudgeBackend for ProviderJudge {
    async fn complete(&self, messages: &[Value]) -> Result<String, CallError> {
        let answer = self
            .client
            .chat(&self.model, messages, self.max_tokens, self.temperature)
            .await
            .map_err(|e| CallError::new(JUDGE_PROVIDER, e))?;
        match answer.text() {
            Some(text) => Ok(text.to_owned()),
            None => Err(CallError::new(
                JUDGE_PROVIDER,
                format!(
                    "{} answered with neither content nor reasoning (finish_reason {})",
                    self.describe(),
                    answer.finish_reason.as_deref().unwrap_or("null"),
                ),
            )),
        }
    }

    fn describe(&self) -> String {
        format!(
            "provider {} model {} at {}",
            self.client.name(),
            self.model,
            self.client.chat_url()
        )
    }
}
