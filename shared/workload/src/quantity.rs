//! Strict parsing of the spec's quantities and durations. Each function returns the value in
//! the scheduler's units, or a message that completes "`<field>`: …".

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::limits::{MAX_DURATION, MAX_DURATION_DAYS};

/// CPU as cores (`"16"`, `"0.5"`) or millicores (`"500m"`), in millicores.
pub fn cpu_milli(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let milli = if let Some(m) = text.strip_suffix('m') {
        digits(m).ok_or(())
    } else {
        decimal_milli(text).ok_or(())
    };
    match milli {
        Ok(0) => Err(format!(
            "{text:?} is zero; leave the field out to request no CPU"
        )),
        Ok(v) => Ok(v),
        Err(()) => Err(format!(
            "{text:?} is not a CPU quantity: use cores (\"16\", \"0.5\") or millicores (\"500m\")"
        )),
    }
}

/// Bytes with a suffix (`"64Gi"`, `"512Mi"`, `"1G"`) or plain bytes, in MiB rounded up.
pub fn memory_mib(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        other => {
            let hint = match other.to_ascii_lowercase().trim_end_matches('b') {
                "k" | "ki" => " (use Ki or k)",
                "m" | "mi" => " (use Mi or M)",
                "g" | "gi" => " (use Gi or G)",
                "t" | "ti" => " (use Ti or T)",
                _ => "",
            };
            return Err(format!(
                "{text:?} has an unknown unit {other:?}{hint}: use a number with an optional \
                 suffix Ki, Mi, Gi, Ti (or k, M, G, T), e.g. \"64Gi\""
            ));
        }
    };
    // Up to 9 decimals, computed exactly in nano-units so "1.5Gi" is exact.
    let nanos = decimal_scaled(number, 9).ok_or_else(|| {
        format!(
            "{text:?} is not a memory quantity: use a number with an optional suffix Ki, Mi, Gi, \
             Ti (or k, M, G, T), e.g. \"64Gi\""
        )
    })?;
    let bytes = (u128::from(nanos) * multiplier).div_ceil(1_000_000_000);
    if bytes == 0 {
        return Err(format!(
            "{text:?} is zero; leave the field out to request none"
        ));
    }
    if bytes < 1 << 20 {
        return Err(format!(
            "{text:?} is less than 1 MiB (plain numbers are bytes); did you mean \"{number}Gi\"?"
        ));
    }
    u64::try_from(bytes.div_ceil(1 << 20)).map_err(|_| format!("{text:?} is too large"))
}

/// Whole GPUs (`4`).
pub fn whole_gpus(text: &str) -> Result<u32, String> {
    let text = text.trim();
    if let Some(v) = digits(text) {
        return u32::try_from(v).map_err(|_| format!("{text:?} is too many GPUs"));
    }
    if text.starts_with('-') {
        return Err(format!(
            "{text:?} is negative: use a whole number of GPUs, e.g. 4 (0 for none)"
        ));
    }
    if decimal_milli(text).is_some() {
        return Err(format!(
            "{text:?} is not a whole number; for a share of one GPU use gpuFraction: \"{text}\""
        ));
    }
    Err(format!("{text:?} is not a number of GPUs"))
}

/// A share of one GPU as a decimal (`"0.25"`), in milli-GPU (1-999).
pub fn gpu_fraction_milli(text: &str) -> Result<u32, String> {
    let text = text.trim();
    match decimal_milli(text) {
        Some(0) => Err(format!(
            "{text:?} is zero; leave the field out to request no GPU"
        )),
        Some(m) if m < 1000 => Ok(m as u32),
        Some(_) => Err(format!(
            "{text:?} is not less than 1; use gpus for whole GPUs"
        )),
        None => Err(format!(
            "{text:?} is not a fraction of a GPU: use a decimal between 0 and 1 with at most \
             three decimals, e.g. \"0.25\""
        )),
    }
}

/// A humantime duration (`"45m"`, `"2h 30m"`), longer than zero and at most
/// [`MAX_DURATION`] (365 days).
pub fn duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d.is_zero() => Err(format!("{text:?} must be longer than zero")),
        Ok(d) if d > MAX_DURATION => Err(too_long(text)),
        Ok(d) => Ok(d),
        Err(humantime::DurationError::NumberOverflow) => Err(overflow(text)),
        Err(e) => Err(format!(
            "{text:?} is not a duration ({e}); use e.g. 90s, 45m, 2h"
        )),
    }
}

fn too_long(text: &str) -> String {
    format!(
        "{text:?} is longer than {MAX_DURATION_DAYS} days, the longest duration a spec may give"
    )
}

/// humantime's one error for a number too large and for one finer than a nanosecond.
fn overflow(text: &str) -> String {
    format!(
        "{text:?} is not a duration: longer than {MAX_DURATION_DAYS} days (the longest a spec \
         may give) or finer than a nanosecond"
    )
}

/// When a task should be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// This long after the workload is submitted.
    AfterSubmit(Duration),
    /// At this time.
    At(DateTime<Utc>),
}

/// A deadline: a duration after submission (`"6h"`) or an RFC 3339 time.
pub fn deadline(text: &str) -> Result<Deadline, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text.trim()) {
        return Ok(Deadline::At(at.with_timezone(&Utc)));
    }
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d > MAX_DURATION => Err(too_long(text)),
        Err(humantime::DurationError::NumberOverflow) => Err(overflow(text)),
        Ok(d) if !d.is_zero() => Ok(Deadline::AfterSubmit(d)),
        _ => Err(format!(
            "{text:?} is neither a duration after submission (\"6h\") nor an RFC 3339 time \
             (\"2026-12-01T18:00:00Z\")"
        )),
    }
}

/// A non-empty run of ASCII digits.
fn digits(s: &str) -> Option<u64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `"1"`, `"0.5"`, `"2.125"` in thousandths; `None` for anything else (more than three
/// decimals, signs, exponents, empty parts).
fn decimal_milli(s: &str) -> Option<u64> {
    decimal_scaled(s, 3)
}

/// A plain decimal with at most `places` decimals, times 10^places.
fn decimal_scaled(s: &str, places: u32) -> Option<u64> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if s.ends_with('.') || frac.len() > places as usize {
        return None;
    }
    let int = digits(int)?;
    let frac_value = if frac.is_empty() {
        0
    } else {
        digits(frac)? * 10u64.pow(places - frac.len() as u32)
    };
    int.checked_mul(10u64.pow(places))?.checked_add(frac_value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_strictly_into_scheduler_units() {
        for (text, want) in [
            ("16", Ok(16_000)),
            ("0.5", Ok(500)),
            ("500m", Ok(500)),
            ("2.125", Ok(2_125)),
            ("0.0005", Err(())),
            ("-1", Err(())),
            ("1e3", Err(())),
            ("m", Err(())),
            ("0", Err(())),
            ("", Err(())),
        ] {
            assert_eq!(cpu_milli(text).map_err(|_| ()), want, "cpu {text:?}");
        }
        for (text, want) in [
            ("64Gi", Ok(65_536)),
            ("512Mi", Ok(512)),
            ("1.5Gi", Ok(1_536)),
            ("1G", Ok(954)),
            ("1048576", Ok(1)),
            ("64", Err(())),
            ("64GB", Err(())),
            ("lots", Err(())),
            ("0Gi", Err(())),
        ] {
            assert_eq!(memory_mib(text).map_err(|_| ()), want, "memory {text:?}");
        }
        for (text, want) in [
            ("4", Ok(4)),
            ("0", Ok(0)),
            ("0.5", Err(())),
            ("four", Err(())),
        ] {
            assert_eq!(whole_gpus(text).map_err(|_| ()), want, "gpus {text:?}");
        }
        for (text, want) in [
            ("0.25", Ok(250)),
            ("0.5", Ok(500)),
            (".5", Err(())),
            ("1", Err(())),
            ("0", Err(())),
            ("0.0001", Err(())),
        ] {
            assert_eq!(
                gpu_fraction_milli(text).map_err(|_| ()),
                want,
                "fraction {text:?}"
            );
        }
    }

    #[test]
    fn errors_say_what_was_wrong_and_what_to_write() {
        assert_eq!(
            memory_mib("64GB").unwrap_err(),
            "\"64GB\" has an unknown unit \"GB\" (use Gi or G): use a number with an optional \
             suffix Ki, Mi, Gi, Ti (or k, M, G, T), e.g. \"64Gi\""
        );
        assert_eq!(
            memory_mib("64").unwrap_err(),
            "\"64\" is less than 1 MiB (plain numbers are bytes); did you mean \"64Gi\"?"
        );
        assert_eq!(
            whole_gpus("0.5").unwrap_err(),
            "\"0.5\" is not a whole number; for a share of one GPU use gpuFraction: \"0.5\""
        );
        assert!(
            duration("2 parsecs")
                .unwrap_err()
                .starts_with("\"2 parsecs\" is not a duration")
        );
        for text in ["18446744073709552s", "366 days", "8761h"] {
            assert_eq!(
                duration(text).unwrap_err(),
                format!("{text:?} is longer than 365 days, the longest duration a spec may give")
            );
            assert_eq!(
                deadline(text).unwrap_err(),
                format!("{text:?} is longer than 365 days, the longest duration a spec may give")
            );
        }
        assert_eq!(duration("365 days"), Ok(MAX_DURATION));
        assert_eq!(
            duration("99999999999999999999999h").unwrap_err(),
            "\"99999999999999999999999h\" is not a duration: longer than 365 days (the longest a \
             spec may give) or finer than a nanosecond"
        );
        assert_eq!(
            whole_gpus("-1").unwrap_err(),
            "\"-1\" is negative: use a whole number of GPUs, e.g. 4 (0 for none)"
        );
        assert_eq!(
            deadline("6h"),
            Ok(Deadline::AfterSubmit(Duration::from_secs(6 * 3600)))
        );
        assert!(matches!(
            deadline("2026-12-01T18:00:00Z"),
            Ok(Deadline::At(_))
        ));
    }
}
