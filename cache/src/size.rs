//! Human-readable sizes ("500M", "1.5GiB").

use crate::error::CacheError;

/// Parses a size. Units are 1024-based and case-insensitive: none or `B`,
/// `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB`.
/// A decimal fraction is allowed (`1.5GiB`); the result is rounded down to
/// whole bytes. Whitespace around the number and unit is ignored.
pub fn parse_size(s: &str) -> Result<u64, CacheError> {
    let err = |reason: &str| CacheError::InvalidSize {
        input: s.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = s.trim();
    if trimmed.is_empty() {
        return Err(err("empty size"));
    }
    let num_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(num_end);
    let unit = unit.trim();

    let shift: u32 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(err(&format!(
                "unknown unit {unit:?} (use B, K, M, G or T, optionally with B or iB)"
            )))
        }
    };

    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("missing number"));
    }
    if frac_part.contains('.') {
        return Err(err("more than one decimal point"));
    }
    if frac_part.len() > 18 {
        return Err(err("too many decimal digits"));
    }

    let too_large = || err("size does not fit in 64 bits");
    let int_value: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse::<u128>().map_err(|_| too_large())?
    };
    let mult: u128 = 1u128 << shift;
    let mut total = int_value.checked_mul(mult).ok_or_else(too_large)?;
    if !frac_part.is_empty() {
        let frac_value: u128 = frac_part.parse().map_err(|_| err("invalid fraction"))?;
        let denom = 10u128.pow(frac_part.len() as u32);
        // frac_value < 10^18 and mult <= 2^40, so this cannot overflow u128.
        total = total.checked_add(frac_value * mult / denom).ok_or_else(too_large)?;
    }
    u64::try_from(total).map_err(|_| too_large())
}

/// Formats a byte count with a 1024-based unit, e.g. `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
