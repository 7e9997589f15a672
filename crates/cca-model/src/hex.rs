//! Lower-case hexadecimal text of bytes, for keys and digests written in
//! files people read (a backup key, a sealed secret's key id).

/// `bytes` as lower-case hex, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The bytes of `text` (two hex digits a byte, either case); `None` when
/// it is not that.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_bad_text_is_refused() {
        assert_eq!(encode(&[0, 171, 255]), "00abff");
        assert_eq!(decode("00ABff"), Some(vec![0, 171, 255]));
        assert_eq!(decode("abc"), None);
        assert_eq!(decode("zz"), None);
        assert_eq!(decode("é0"), None);
    }
}
