//! An image content part read into its bytes, size and content hash.

use std::sync::Arc;

use base64::Engine as _;
use ps_core::message::{ImageSource, image_source};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::VisionError;

/// Bounds on a turn's images (`capture.max_image_mib`, `capture.max_images_per_turn`).
#[derive(Debug, Clone, Copy)]
pub struct ImageLimits {
    pub max_image_bytes: usize,
    pub max_images: usize,
}

impl ImageLimits {
    /// No bound: for reading again an image that was within bounds when it was captured (a
    /// resumed turn), and for the fake engine.
    pub fn unbounded() -> Self {
        ImageLimits {
            max_image_bytes: usize::MAX,
            max_images: usize::MAX,
        }
    }
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits {
            max_image_bytes: 20 << 20,
            max_images: 64,
        }
    }
}

/// An image as a turn carried it: its decoded bytes, their SHA-256 (hex, the key it is stored
/// under once however often a conversation re-sends it), its media type and its size in pixels
/// as its header states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub hash: String,
    pub mime: String,
    pub bytes: Arc<[u8]>,
    pub width: u64,
    pub height: u64,
}

/// Reads an image part: only inline data (`data:<type>;base64,…`) is read; a remote URL, a
/// missing or non-base64 payload, an unreadable header or an image over the byte limit is an
/// error whose [`VisionError::reason`] drops the turn.
pub fn read_image_part(part: &Value, limits: &ImageLimits) -> Result<Image, VisionError> {
    let payload = match image_source(part) {
        None => {
            return Err(VisionError::NoData {
                detail: "no image_url.url, image or source".into(),
            });
        }
        Some(ImageSource::Url(url)) => {
            let shown: String = url.chars().take(80).collect();
            return if url.starts_with("http://") || url.starts_with("https://") {
                Err(VisionError::Remote { url: shown })
            } else {
                Err(VisionError::NoData {
                    detail: format!("a URL that is neither data: nor http(s): {shown}"),
                })
            };
        }
        Some(ImageSource::Data {
            mime,
            base64: false,
            ..
        }) => {
            return Err(VisionError::NotBase64 {
                detail: format!("data:{mime} is not ;base64"),
            });
        }
        Some(ImageSource::Data { data, .. }) => data,
    };
    // A decoded image is about 3/4 of its base64: refuse before decoding what is far too large.
    if payload.len() / 4 * 3 > limits.max_image_bytes.saturating_add(3) {
        return Err(VisionError::TooLarge {
            bytes: payload.len() / 4 * 3,
            limit: limits.max_image_bytes,
        });
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(payload.trim())
        .map_err(|e| VisionError::NotBase64 {
            detail: e.to_string(),
        })?;
    if bytes.len() > limits.max_image_bytes {
        return Err(VisionError::TooLarge {
            bytes: bytes.len(),
            limit: limits.max_image_bytes,
        });
    }
    let size = imagesize::blob_size(&bytes).map_err(|e| VisionError::Undecodable {
        detail: e.to_string(),
    })?;
    let kind = imagesize::image_type(&bytes).map_err(|e| VisionError::Undecodable {
        detail: e.to_string(),
    })?;
    let known = match kind {
        imagesize::ImageType::Png => "image/png",
        imagesize::ImageType::Jpeg => "image/jpeg",
        imagesize::ImageType::Webp => "image/webp",
        imagesize::ImageType::Gif => "image/gif",
        other => {
            return Err(VisionError::Undecodable {
                detail: format!("{other:?} is not one of PNG, JPEG, WebP, GIF"),
            });
        }
    };
    let hash = format!("{:x}", Sha256::digest(&bytes));
    Ok(Image {
        hash,
        // What the bytes are, whatever the data URL declared.
        mime: known.to_owned(),
        bytes: bytes.into(),
        width: size.width as u64,
        height: size.height as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A valid 3x2 PNG header (signature + IHDR); the size is all `imagesize` reads.
    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut b = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13];
        b.extend_from_slice(b"IHDR");
        b.extend_from_slice(&width.to_be_bytes());
        b.extend_from_slice(&height.to_be_bytes());
        b.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        b
    }

    fn data_url(bytes: &[u8]) -> String {
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    }

    #[test]
    fn every_shape_of_image_part_is_read() {
        let bytes = png(640, 480);
        let url = data_url(&bytes);
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let parts = [
            json!({"type": "image_url", "image_url": {"url": url}}),
            json!({"type": "image_url", "image_url": url}),
            json!({"type": "input_image", "image_url": url}),
            json!({"type": "image", "image": url}),
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}),
        ];
        let first = read_image_part(&parts[0], &ImageLimits::default()).unwrap();
        assert_eq!((first.width, first.height), (640, 480));
        assert_eq!(first.mime, "image/png");
        assert_eq!(&*first.bytes, &bytes[..]);
        assert_eq!(first.hash.len(), 64);
        for p in &parts[1..] {
            assert_eq!(
                read_image_part(p, &ImageLimits::default()).unwrap(),
                first,
                "{p}"
            );
        }
        // The media type is what the bytes are, whatever the data URL declares.
        let declared = json!({"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{b64}")}});
        assert_eq!(
            read_image_part(&declared, &ImageLimits::default())
                .unwrap()
                .mime,
            "image/png"
        );
    }

    #[test]
    fn what_cannot_be_read_exactly_is_an_error_with_its_reason() {
        let limits = ImageLimits {
            max_image_bytes: 64,
            ..ImageLimits::default()
        };
        let cases = [
            (
                json!({"type": "image_url", "image_url": {"url": "https://x/cat.png"}}),
                "image_remote",
            ),
            (
                json!({"type": "image", "source": {"type": "url", "url": "http://x/c.png"}}),
                "image_remote",
            ),
            (json!({"type": "image_url"}), "image_unreadable"),
            (
                json!({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}),
                "image_unreadable",
            ),
            (
                json!({"type": "image_url", "image_url": {"url": "data:image/png,abc"}}),
                "image_unreadable",
            ),
            (
                json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!!"}}),
                "image_unreadable",
            ),
            (
                json!({"type": "image_url", "image_url": {"url": data_url(b"not an image at all")}}),
                "image_undecodable",
            ),
            (
                json!({"type": "image_url", "image_url": {"url": data_url(&[png(1, 1), vec![0; 100]].concat())}}),
                "image_too_large",
            ),
        ];
        for (part, reason) in cases {
            let e = read_image_part(&part, &limits).unwrap_err();
            assert_eq!(e.reason(), reason, "{part}: {e}");
        }
    }

    #[test]
    fn the_same_bytes_hash_alike_and_other_bytes_do_not() {
        let l = ImageLimits::default();
        let a = |w, h| {
            read_image_part(
                &json!({"type": "image_url", "image_url": data_url(&png(w, h))}),
                &l,
            )
            .unwrap()
            .hash
        };
        assert_eq!(a(10, 10), a(10, 10));
        assert_ne!(a(10, 10), a(10, 11));
    }
}
