//! What a vision-language policy's processor makes of an image, without decoding it: the image's
//! bytes from a chat content part (data URLs only: the proxy never fetches a URL), its size from
//! the file header (PNG, JPEG, WebP, GIF), the content hash it is stored under, and the number of
//! image pad tokens a Qwen-VL-style processor expands its one placeholder to (the "smart resize"
//! rule of `transformers`' `Qwen2VLImageProcessor`, which Qwen2-VL, Qwen2.5-VL, Qwen3-VL and
//! Qwen3.5 share, read from the model's `preprocessor_config.json`).
//!
//! Pure and synchronous; it depends on `ps-core` alone (where an image part's image is), never on
//! HTTP or an async runtime. Parity with `transformers` is tested against the Python processor itself
//! (`tests/transformers_parity.rs`).

mod part;

use std::path::Path;

use serde::Deserialize;

pub use part::{Image, ImageLimits, read_image_part};

/// Name of the processor file in a model directory.
pub const PREPROCESSOR_CONFIG_FILE: &str = "preprocessor_config.json";

/// Why an image cannot be captured exactly; [`VisionError::reason`] is the turn's drop reason.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error(
        "the image is a remote URL ({url}): the proxy never fetches URLs, so it cannot know what \
         the engine saw; send it as a data URL (data:image/png;base64,…)"
    )]
    Remote { url: String },
    #[error(
        "the image part has no data URL (expected image_url.url = \"data:image/…;base64,…\"): {detail}"
    )]
    NoData { detail: String },
    #[error("the image's data URL is not base64 data: {detail}")]
    NotBase64 { detail: String },
    #[error("the image's header cannot be read as PNG, JPEG, WebP or GIF: {detail}")]
    Undecodable { detail: String },
    #[error(
        "the image is {bytes} bytes, over the limit of {limit} (capture.max_image_bytes): the turn \
         is not captured"
    )]
    TooLarge { bytes: usize, limit: usize },
    #[error(
        "the turn has {count} images, over the limit of {limit} (capture.max_images_per_turn): \
         the turn is not captured"
    )]
    TooMany { count: usize, limit: usize },
    #[error("the image is {width}x{height}: an aspect ratio over 200, which the processor refuses")]
    AspectRatio { width: u64, height: u64 },
    #[error("{path}: {source}")]
    ConfigUnreadable {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a processor configuration: {detail}")]
    ConfigInvalid { path: String, detail: String },
}

impl VisionError {
    /// The stable drop reason of a turn refused for this error (counted in status and `/metrics`).
    pub fn reason(&self) -> &'static str {
        match self {
            VisionError::Remote { .. } => "image_remote",
            VisionError::NoData { .. } | VisionError::NotBase64 { .. } => "image_unreadable",
            VisionError::Undecodable { .. } => "image_undecodable",
            VisionError::TooLarge { .. } => "image_too_large",
            VisionError::TooMany { .. } => "too_many_images",
            VisionError::AspectRatio { .. } => "image_aspect_ratio",
            VisionError::ConfigUnreadable { .. } | VisionError::ConfigInvalid { .. } => {
                "vision_config_invalid"
            }
        }
    }
}

/// The parts of a Qwen-VL-style `preprocessor_config.json` that decide how many tokens an image
/// becomes. `transformers` reads `min_pixels` / `max_pixels` over `size.shortest_edge` /
/// `size.longest_edge` (older and newer spellings of the same two bounds); the defaults are its
/// class defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageProcessor {
    pub patch_size: u64,
    pub merge_size: u64,
    pub temporal_patch_size: u64,
    pub min_pixels: u64,
    pub max_pixels: u64,
}

/// `transformers`' class defaults (`Qwen2VLImageProcessor`).
impl Default for ImageProcessor {
    fn default() -> Self {
        ImageProcessor {
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
        }
    }
}

#[derive(Deserialize)]
struct RawConfig {
    patch_size: Option<u64>,
    merge_size: Option<u64>,
    temporal_patch_size: Option<u64>,
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    size: Option<RawSize>,
    do_resize: Option<bool>,
}

#[derive(Deserialize)]
struct RawSize {
    shortest_edge: Option<u64>,
    longest_edge: Option<u64>,
}

impl ImageProcessor {
    /// The processor of a model directory: `Ok(None)` when it has no `preprocessor_config.json`
    /// (a text-only model, or a directory with the tokenizer alone).
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, VisionError> {
        let path = dir.join(PREPROCESSOR_CONFIG_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::from_json(&text, &path.display().to_string()).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(VisionError::ConfigUnreadable {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Parses a `preprocessor_config.json`'s text; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, VisionError> {
        let invalid = |detail: String| VisionError::ConfigInvalid {
            path: origin.to_owned(),
            detail,
        };
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if raw.do_resize == Some(false) {
            return Err(invalid(
                "do_resize = false: images are not resized to the patch grid, which this proxy \
                 does not model"
                    .into(),
            ));
        }
        let d = ImageProcessor::default();
        let size = raw.size.as_ref();
        let p = ImageProcessor {
            patch_size: raw.patch_size.unwrap_or(d.patch_size),
            merge_size: raw.merge_size.unwrap_or(d.merge_size),
            temporal_patch_size: raw.temporal_patch_size.unwrap_or(d.temporal_patch_size),
            min_pixels: raw
                .min_pixels
                .or(size.and_then(|s| s.shortest_edge))
                .unwrap_or(d.min_pixels),
            max_pixels: raw
                .max_pixels
                .or(size.and_then(|s| s.longest_edge))
                .unwrap_or(d.max_pixels),
        };
        if p.patch_size == 0 || p.merge_size == 0 || p.temporal_patch_size == 0 {
            return Err(invalid(
                "patch_size, merge_size and temporal_patch_size must be positive".into(),
            ));
        }
        if p.min_pixels > p.max_pixels || p.max_pixels == 0 {
            return Err(invalid(format!(
                "min pixels {} over max pixels {}",
                p.min_pixels, p.max_pixels
            )));
        }
        Ok(p)
    }

    /// The side every resized dimension is a multiple of.
    pub fn factor(&self) -> u64 {
        self.patch_size * self.merge_size
    }

    /// The size (height, width) the processor resizes a `width` × `height` image to.
    pub fn resized(&self, width: u64, height: u64) -> Result<(u64, u64), VisionError> {
        smart_resize(
            height,
            width,
            self.factor(),
            self.min_pixels,
            self.max_pixels,
        )
    }

    /// The image's grid of patches `[t, h, w]` (`image_grid_thw`; `t` is 1 for an image).
    pub fn grid_thw(&self, width: u64, height: u64) -> Result<[u64; 3], VisionError> {
        let (h, w) = self.resized(width, height)?;
        Ok([1, h / self.patch_size, w / self.patch_size])
    }

    /// How many `<|image_pad|>` tokens the image's one placeholder becomes
    /// (`image_grid_thw.prod() // merge_size**2`, as `Qwen2VLProcessor` expands it).
    pub fn pad_tokens(&self, width: u64, height: u64) -> Result<usize, VisionError> {
        let [t, h, w] = self.grid_thw(width, height)?;
        Ok(usize::try_from(t * h * w / (self.merge_size * self.merge_size)).unwrap_or(usize::MAX))
    }
}

/// `transformers`' `smart_resize`: both sides multiples of `factor`, the pixel count within
/// `[min_pixels, max_pixels]`, the aspect ratio kept as closely as possible. Floating point as in
/// Python, whose `round` rounds halves to even (`round(2.5) == 2`): `f64::round` would not.
pub fn smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u64, u64), VisionError> {
    let (hf, wf, ff) = (height as f64, width as f64, factor as f64);
    if height == 0 || width == 0 || hf.max(wf) / hf.min(wf) > 200.0 {
        return Err(VisionError::AspectRatio { width, height });
    }
    let mut h_bar = (hf / ff).round_ties_even() as u64 * factor;
    let mut w_bar = (wf / ff).round_ties_even() as u64 * factor;
    if h_bar * w_bar > max_pixels {
        let beta = ((height * width) as f64 / max_pixels as f64).sqrt();
        h_bar = factor.max((hf / beta / ff).floor() as u64 * factor);
        w_bar = factor.max((wf / beta / ff).floor() as u64 * factor);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / (height * width) as f64).sqrt();
        h_bar = (hf * beta / ff).ceil() as u64 * factor;
        w_bar = (wf * beta / ff).ceil() as u64 * factor;
    }
    Ok((h_bar, w_bar))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rounds_halves_to_even_and_so_do_we() {
        // 42 / 28 = 1.5 → 2 and 70 / 28 = 2.5 → 2 in Python (3 with f64::round); the min pixels
        // clamp is out of the way.
        assert_eq!(smart_resize(42, 70, 28, 0, u64::MAX).unwrap(), (56, 56));
        assert_eq!(smart_resize(98, 98, 28, 0, u64::MAX).unwrap(), (112, 112));
    }

    #[test]
    fn the_pixel_bounds_clamp_both_ways() {
        let p = ImageProcessor::default();
        // Tiny: scaled up to at least min_pixels.
        let (h, w) = p.resized(10, 10).unwrap();
        assert!(
            h * w >= p.min_pixels && h % 28 == 0 && w % 28 == 0,
            "{h}x{w}"
        );
        // Huge: scaled down to at most max_pixels.
        let (h, w) = p.resized(8000, 6000).unwrap();
        assert!(
            h * w <= p.max_pixels && h % 28 == 0 && w % 28 == 0,
            "{h}x{w}"
        );
        assert_eq!(p.pad_tokens(200, 100).unwrap(), 8 * 14 / 4);
    }

    #[test]
    fn an_aspect_ratio_over_200_is_refused() {
        let e = smart_resize(1, 201, 28, 0, u64::MAX).unwrap_err();
        assert_eq!(e.reason(), "image_aspect_ratio");
        assert!(smart_resize(1, 200, 28, 3136, 1 << 40).is_ok());
    }

    #[test]
    fn both_spellings_of_the_bounds_are_read() {
        let old = ImageProcessor::from_json(
            r#"{"min_pixels": 100, "max_pixels": 1000, "patch_size": 16}"#,
            "x",
        )
        .unwrap();
        assert_eq!(
            (old.min_pixels, old.max_pixels, old.patch_size),
            (100, 1000, 16)
        );
        let new = ImageProcessor::from_json(
            r#"{"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16,
                "merge_size": 2, "temporal_patch_size": 2}"#,
            "x",
        )
        .unwrap();
        assert_eq!(
            (new.min_pixels, new.max_pixels, new.factor()),
            (65536, 16777216, 32)
        );
        for bad in [
            r#"{"patch_size": 0}"#,
            r#"{"min_pixels": 10, "max_pixels": 5}"#,
            r#"{"do_resize": false}"#,
            "not json",
        ] {
            let e = ImageProcessor::from_json(bad, "dir/preprocessor_config.json").unwrap_err();
            assert_eq!(e.reason(), "vision_config_invalid", "{bad}");
            assert!(
                e.to_string().contains("dir/preprocessor_config.json"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_directory_without_the_file_has_no_processor() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ImageProcessor::from_dir(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join(PREPROCESSOR_CONFIG_FILE), "{}").unwrap();
        assert_eq!(
            ImageProcessor::from_dir(dir.path()).unwrap(),
            Some(ImageProcessor::default())
        );
    }
}
