//! Byte counts as people write them: `64MiB`, `1.5GiB`, `512KB`.

/// Parses `64MiB`, `64M`, `1.5GiB`, `2GB`, `4096` (bytes). K/M/G/T are
/// binary (as llama.cpp and most GPU tools count memory); `KB`/`MB`/`GB`
/// are decimal.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    (number >= 0.0).then(|| (number * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_people_write() {
        assert_eq!(parse_bytes("64MiB"), Some(64 << 20));
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_bytes("2GB"), Some(2_000_000_000));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("12XB"), None);
    }
}
