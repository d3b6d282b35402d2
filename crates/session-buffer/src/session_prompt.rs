//! A session's latest prompt as the OPD teacher path encoded it (a leaf: the session state keeps
//! one, the teacher path reads and refills it).

use std::sync::{Arc, Mutex};

use ps_chat_template::EncodedPrefix;

/// A session's latest prompt as the teacher path encoded it, with exactly its own ids: an
/// engine-id turn's prompt ids are the engine's, which may differ from our encoding of its text
/// (the drift check), so unless the drift check agrees (`OpdParts::engine_prompts`: then those
/// ids are built on, and nothing is read or kept here) the teacher path encodes the prompt text
/// itself, starting from this (only what the conversation added since is encoded), and keeps the
/// result here for the next turn. Shared by the session and its turns being judged; it goes when
/// they do. Costs, per session that had an engine-id turn taught this way, its latest prompt: the
/// text (~4 bytes per token), 4 bytes per id and 16 per added token (a 20,000-token agent prompt:
/// ~165 kB); nothing per turn. Emptied when the session closes ([`SessionPrompt::close`]); a turn
/// still being judged then cannot refill it. Not used at all for a tokenizer that does not splice.
#[derive(Clone, Default)]
pub(crate) struct SessionPrompt(Arc<Mutex<LatestPrompt>>);

#[derive(Default)]
struct LatestPrompt {
    prompt: Option<Arc<EncodedPrefix>>,
    closed: bool,
}

impl SessionPrompt {
    pub(crate) fn get(&self) -> Option<Arc<EncodedPrefix>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .prompt
            .clone()
    }

    /// Keeps `prompt` as the latest, unless this was closed.
    pub(crate) fn set(&self, prompt: Arc<EncodedPrefix>) {
        let mut latest = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !latest.closed {
            latest.prompt = Some(prompt);
        }
    }

    /// Drops the kept prompt for good: later [`SessionPrompt::set`]s are ignored.
    pub(crate) fn close(&self) {
        let mut latest = self.0.lock().unwrap_or_else(|p| p.into_inner());
        latest.closed = true;
        latest.prompt = None;
    }
}
