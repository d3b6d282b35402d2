//! What capture counts ([`CaptureStats`]): by id source, the drift check's findings.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ps_chat_template::{ChatTokenizer, ImageLimits};

use crate::DriftCheck;

/// What capture counted: where ids came from, fallbacks, drift.
#[derive(Debug, Default)]
pub struct CaptureStats {
    pub engine: AtomicU64,
    pub retokenized: AtomicU64,
    /// Turns whose engine was asked for ids and answered without them.
    pub engine_ids_missing: AtomicU64,
    pub drift: DriftCheck,
    /// Refusal reasons already explained in the log (each is logged once with its fix).
    pub(crate) explained: std::sync::Mutex<std::collections::HashSet<&'static str>>,
    /// `capture.max_image_mib` in bytes and `capture.max_images_per_turn` (0: the defaults).
    pub(crate) max_image_bytes: AtomicUsize,
    pub(crate) max_images: AtomicUsize,
    /// The sample store does not keep images (`SampleLog::keeps_images`): turns with images are
    /// refused even for a vision-language model.
    pub(crate) store_without_images: std::sync::atomic::AtomicBool,
    /// Routed experts: the mode, the model's routing shape, what was counted.
    pub experts: crate::ExpertStats,
}

impl CaptureStats {
    pub fn new(drift: DriftCheck) -> Self {
        Self {
            drift,
            ..Self::default()
        }
    }

    /// Bounds on a turn's images (`capture.max_image_mib`, `capture.max_images_per_turn`).
    pub fn set_image_limits(&self, limits: ImageLimits) {
        self.max_image_bytes
            .store(limits.max_image_bytes, Ordering::Relaxed);
        self.max_images.store(limits.max_images, Ordering::Relaxed);
    }

    /// Whether the sample store keeps images (set by the composition root; true by default).
    pub fn set_store_keeps_images(&self, keeps: bool) {
        self.store_without_images.store(!keeps, Ordering::Relaxed);
    }

    /// Whether turns with images are captured with `tok`: it is a vision-language model and the
    /// store keeps images.
    pub fn captures_images(&self, tok: &ChatTokenizer) -> bool {
        self.captures_images_of(tok.vision().is_some())
    }

    /// [`Self::captures_images`] of a model that has vision or not.
    pub(crate) fn captures_images_of(&self, vision: bool) -> bool {
        vision && !self.store_without_images.load(Ordering::Relaxed)
    }

    /// The bounds in effect.
    pub fn image_limits(&self) -> ImageLimits {
        let d = ImageLimits::default();
        let or = |v: usize, d: usize| if v == 0 { d } else { v };
        ImageLimits {
            max_image_bytes: or(
                self.max_image_bytes.load(Ordering::Relaxed),
                d.max_image_bytes,
            ),
            max_images: or(self.max_images.load(Ordering::Relaxed), d.max_images),
        }
    }

    /// `/v1/rollout/status`'s `token_ids` section.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "engine": self.engine.load(Ordering::Relaxed),
            "retokenized": self.retokenized.load(Ordering::Relaxed),
            "engine_ids_missing": self.engine_ids_missing.load(Ordering::Relaxed),
            "drift_checked": self.drift.checked.load(Ordering::Relaxed),
            "drift": self.drift.drifted.load(Ordering::Relaxed),
            "last_drift": self.drift.last.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            "engine_prompts_agree": self.drift.prompts.agree(),
        })
    }

    /// Whether `reason` is logged for the first time (then with its fix).
    pub(crate) fn first_time(&self, reason: &'static str) -> bool {
        self.explained
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(reason)
    }
}
