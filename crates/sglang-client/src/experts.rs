//! A mixture-of-experts engine's routed experts in an answer: SGLang's `sglext.routed_experts`
//! (base64 of raw little-endian int32, no shape; on a stream in the final `choices: []` chunk)
//! and vLLM's `choices[i].routed_experts` (base64 of a NumPy `.npy` file of shape
//! `(tokens − 1, layers, top_k)`, `uint8` or `uint16`; whole answers only).
//! docs/upstream-protocols.md section 9.

use base64::Engine as _;
use ps_core::{EngineExperts, ExpertWidth};
use ps_json::{self as raw, RawObject};

/// SGLang's field, in `sglext` (response level).
pub const SGLANG_FIELD: &str = "sglext.routed_experts";
/// vLLM's field, in the first choice.
pub const VLLM_FIELD: &str = "choices[0].routed_experts";

/// The experts in an `sglext` object's text, when it has them: `Err` names what is wrong.
pub fn from_sglext(sglext: Option<&str>) -> Option<Result<EngineExperts, String>> {
    encoded_in_sglext(sglext).map(|text| sglang(text.as_deref()))
}

/// The base64 text of the experts in an `sglext` object, undecoded (`None` inside: not a
/// string); `None` when it has none.
pub fn encoded_in_sglext(sglext: Option<&str>) -> Option<Option<String>> {
    let obj = RawObject::parse(sglext?).ok()?;
    let value = obj.get("routed_experts")?;
    if value.get().trim() == "null" {
        return None;
    }
    Some(raw::as_str(value).map(|t| t.into_owned()))
}

/// SGLang's experts from their base64 text (what a stream left undecoded).
pub fn decode_sglang(text: &str) -> Result<EngineExperts, String> {
    sglang(Some(text))
}

fn sglang(text: Option<&str>) -> Result<EngineExperts, String> {
    let text = text.ok_or_else(|| format!("{SGLANG_FIELD} is not a string"))?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("{SGLANG_FIELD} is not base64: {e}"))?;
    if !data.len().is_multiple_of(4) {
        return Err(format!(
            "{SGLANG_FIELD} holds {} bytes, not whole int32 values",
            data.len()
        ));
    }
    Ok(EngineExperts {
        width: ExpertWidth::Int32,
        data,
        shape: None,
        field: SGLANG_FIELD.into(),
    })
}

/// The experts of a choice (vLLM), when it has them.
pub fn from_choice(routed_experts: Option<&str>) -> Option<Result<EngineExperts, String>> {
    let value = routed_experts?;
    if value.trim() == "null" {
        return None;
    }
    let text = serde_json::from_str::<String>(value).ok();
    Some(vllm(text.as_deref()))
}

fn vllm(text: Option<&str>) -> Result<EngineExperts, String> {
    let text = text.ok_or_else(|| format!("{VLLM_FIELD} is not a string"))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("{VLLM_FIELD} is not base64: {e}"))?;
    let bad = |e: std::io::Error| format!("{VLLM_FIELD} is not a NumPy .npy file: {e}");
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(bad)?;
    let shape = match npy.shape() {
        [a, b, c] => [*a, *b, *c].map(|d| usize::try_from(d).unwrap_or(usize::MAX)),
        other => {
            return Err(format!(
                "{VLLM_FIELD} has shape {other:?}, not (tokens − 1, layers, top_k)"
            ));
        }
    };
    if npy.order() != npyz::Order::C {
        return Err(format!("{VLLM_FIELD} is in Fortran order, not C order"));
    }
    let descr = npy.dtype().descr();
    let (width, data) = match descr
        .trim_matches(['\'', '"'])
        .trim_start_matches(['<', '|', '='])
    {
        "u1" => (ExpertWidth::Uint8, npy.into_vec::<u8>().map_err(bad)?),
        "u2" => (
            ExpertWidth::Uint16,
            npy.into_vec::<u16>()
                .map_err(bad)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        "i4" => (
            ExpertWidth::Int32,
            npy.into_vec::<i32>()
                .map_err(bad)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        other => {
            return Err(format!(
                "{VLLM_FIELD} has dtype {other}, not uint8, uint16 or int32"
            ));
        }
    };
    Ok(EngineExperts {
        width,
        data,
        shape: Some(shape),
        field: VLLM_FIELD.into(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use npyz::WriterBuilder as _;

    /// A `.npy` file as NumPy writes one.
    fn npy<T: npyz::AutoSerialize + Copy>(shape: &[u64], values: &[T]) -> String {
        let mut out = Vec::new();
        let mut w = npyz::WriteOptions::<T>::new()
            .default_dtype()
            .shape(shape)
            .writer(&mut out)
            .begin_nd()
            .unwrap();
        w.extend(values.iter().copied()).unwrap();
        w.finish().unwrap();
        base64::engine::general_purpose::STANDARD.encode(out)
    }

    #[test]
    fn vllm_npy_keeps_its_width_and_shape() {
        let text = serde_json::to_string(&npy(&[2, 2, 1], &[1u8, 2, 3, 200])).unwrap();
        let e = from_choice(Some(&text)).unwrap().unwrap();
        assert_eq!(e.shape, Some([2, 2, 1]));
        assert_eq!(e.width, ExpertWidth::Uint8);
        assert_eq!(e.data, [1, 2, 3, 200]);
        let text = serde_json::to_string(&npy(&[1, 1, 2], &[300u16, 7])).unwrap();
        let e = from_choice(Some(&text)).unwrap().unwrap();
        assert_eq!(e.width, ExpertWidth::Uint16);
        assert_eq!(e.data, [44, 1, 7, 0]);
        assert!(from_choice(Some("null")).is_none());
        assert!(from_choice(None).is_none());
    }

    #[test]
    fn sglang_int32_has_no_shape() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(
            [1i32, 2, 300]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let sglext = format!(r#"{{"routed_experts":"{b64}","output_ids":[1]}}"#);
        let e = from_sglext(Some(&sglext)).unwrap().unwrap();
        assert_eq!((e.width, e.shape, e.len()), (ExpertWidth::Int32, None, 3));
        assert!(from_sglext(Some(r#"{"output_ids":[1]}"#)).is_none());
    }

    #[test]
    fn broken_experts_are_errors_naming_the_field() {
        for (got, field) in [
            (
                from_sglext(Some(r#"{"routed_experts":"***"}"#)),
                SGLANG_FIELD,
            ),
            (
                from_sglext(Some(r#"{"routed_experts":"AAAA AA=="}"#)),
                SGLANG_FIELD,
            ),
            (from_sglext(Some(r#"{"routed_experts":5}"#)), SGLANG_FIELD),
            (from_choice(Some(r#""AAAA""#)), VLLM_FIELD),
            (from_choice(Some("[1, 2]")), VLLM_FIELD),
        ] {
            let e = got.unwrap().unwrap_err();
            assert!(e.contains(field), "{e}");
        }
        let two_d = serde_json::to_string(&npy(&[2, 2], &[1u8, 2, 3, 4])).unwrap();
        let e = from_choice(Some(&two_d)).unwrap().unwrap_err();
        assert!(e.contains("not (tokens − 1, layers, top_k)"), "{e}");
    }
}
