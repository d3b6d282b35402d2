//! Deterministic pseudo-randomness: every "random" value the fake produces is a pure function of the
//! request, so tests can predict it. Hand-written (FNV-1a + splitmix64) so values never change with the
//! Rust version, unlike `DefaultHasher`.

/// FNV-1a over bytes.
pub(crate) fn hash_str(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// splitmix64 finaliser of `a` combined with `b`.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A value in `[0, 1)` from a hash (53 high bits).
pub(crate) fn unit(h: u64) -> f64 {
    // 53 bits fit exactly in an f64 mantissa.
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The log-probability the fake policy gives to sampling token `id` at completion position `position`
/// (0 = first sampled token). Always in `(-5, 0]`. Used for chat `logprobs` and `/generate`
/// `output_token_logprobs`.
pub fn policy_logprob(id: u32, position: usize) -> f64 {
    let u = unit(mix(mix(0x706f_6c69_6379, u64::from(id)), position as u64));
    -5.0 * u * u
}

/// The log-probability the fake teacher gives to token `id` at prompt position `position`, which follows
/// token `prev_id`. Always in `(-4, 0]`. This is the value of `/generate`'s `input_token_logprobs` entry for
/// that position (except entry 0, which is always null, as in SGLang).
pub fn teacher_logprob(prev_id: u32, id: u32, position: usize) -> f64 {
    let h = mix(
        mix(
            mix(0x0074_6561_6368_6572, u64::from(prev_id)),
            u64::from(id),
        ),
        position as u64,
    );
    let u = unit(h);
    -4.0 * u * u * u
}

/// `n` lowercase hex digits derived from `seed`.
pub(crate) fn hex_id(seed: u64, n: usize) -> String {
    let mut out = String::with_capacity(n);
    let mut h = seed;
    let mut i = 0u64;
    while out.len() < n {
        h = mix(h, i);
        i += 1;
        out.push_str(&format!("{h:016x}"));
    }
    out.truncate(n);
    out
}

/// Alternative token ids for top-k lists: `k` distinct ids different from `id` (ids below `id` when
/// possible, so they stay inside the vocabulary).
pub(crate) fn alternatives(id: u32, k: usize) -> Vec<u32> {
    (1..=k as u32)
        .map(|d| if id >= d { id - d } else { id + d })
        .collect()
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_in_range_and_pure() {
        for id in [0u32, 1, 7, 151_645] {
            for pos in 0..50 {
                let p = policy_logprob(id, pos);
                assert!(p > -5.0 && p <= 0.0, "{p}");
                assert_eq!(p, policy_logprob(id, pos));
                let t = teacher_logprob(id.wrapping_add(3), id, pos);
                assert!(t > -4.0 && t <= 0.0, "{t}");
            }
        }
        assert_ne!(policy_logprob(5, 1), policy_logprob(5, 2));
    }

    #[test]
    fn hex_ids_have_the_requested_length() {
        let h = hex_id(42, 24);
        assert_eq!(h.len(), 24);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(h, hex_id(42, 24));
    }

    #[test]
    fn alternatives_are_distinct_and_exclude_the_token() {
        let a = alternatives(1, 4);
        assert_eq!(a, vec![0, 3, 4, 5]);
        assert!(!a.contains(&1));
    }
}
