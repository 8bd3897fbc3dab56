//! Durations on the command line.

use std::time::Duration;

/// `60s`, `500ms`, `2m`, `1h`, `1h30m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration `{s}`: expected e.g. 500ms, 60s, 2m, 1h"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| format!("invalid duration `{s}`"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let d = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" | "min" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            u => return Err(format!("invalid duration unit `{u}` in `{s}`: use ms, s, m or h")),
        };
        total += d;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("60").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5x").is_err());
    }
}
