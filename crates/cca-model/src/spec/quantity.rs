//! Quantities with units as the language writes them and the cluster uses
//! them: CPU in millicores, memory in bytes, durations in milliseconds and
//! whole percentages. Parsing lives here so every reader of a fact agrees on
//! what `500m` or `256Mi` means.

use serde::{Deserialize, Serialize};

/// Why a quantity string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("`{0}` is not a number")]
    NotANumber(String),
    #[error("unknown unit `{unit}`; expected one of: {}", expected.join(", "))]
    UnknownUnit {
        unit: String,
        expected: &'static [&'static str],
    },
    #[error("`{0}` is too large")]
    Overflow(String),
    #[error("`{0}` is more precise than the unit allows")]
    TooPrecise(String),
}

/// CPU in thousandths of a core: `500m` is half a core, `2` is two cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Cpu(pub u64);

/// Memory in bytes: `256Mi`, `1Gi`, `512M`, `1024`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Memory(pub u64);

/// A span of time in milliseconds: `500ms`, `10s`, `5m`, `1h`, `1d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Duration(pub u64);

/// A whole percentage: `70%`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Percent(pub u32);

const CPU_UNITS: &[&str] = &["m", "(none: cores)"];
const MEMORY_UNITS: &[&str] = &["Ki", "Mi", "Gi", "Ti", "K", "M", "G", "T", "(none: bytes)"];
const DURATION_UNITS: &[&str] = &["ms", "s", "m", "h", "d"];
const PERCENT_UNITS: &[&str] = &["%"];

impl Cpu {
    /// Reads `500m` (millicores) or `2` / `1.5` (cores).
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let (number, unit) = split_unit(text);
        let scale = match unit {
            "m" => 1,
            "" => 1000,
            _ => return Err(unknown(unit, CPU_UNITS)),
        };
        scaled(text, number, scale).map(Cpu)
    }
}

impl Memory {
    /// For people, not for parsing back: the largest binary unit the
    /// amount reaches, with one decimal when it is not whole (`384Mi`,
    /// `23.5Gi`), and `B` below a KiB (`100B`). Every table, description
    /// and message that shows memory uses this one form.
    pub fn human(self) -> String {
        const UNITS: [(&str, u64); 4] = [
            ("Ti", 1 << 40),
            ("Gi", 1 << 30),
            ("Mi", 1 << 20),
            ("Ki", 1 << 10),
        ];
        let bytes = u128::from(self.0);
        let Some(index) = UNITS
            .iter()
            .position(|(_, size)| bytes >= u128::from(*size))
        else {
            return format!("{bytes}B");
        };
        let (mut unit, size) = UNITS[index];
        let size = u128::from(size);
        // Rounded to tenths; 1023.96Mi rounds up to the next unit, 1Gi.
        let mut tenths = (bytes * 10 + size / 2) / size;
        if tenths >= 10 * 1024 && index > 0 {
            unit = UNITS[index - 1].0;
            tenths /= 1024;
        }
        if tenths % 10 == 0 {
            format!("{}{unit}", tenths / 10)
        } else {
            format!("{}.{}{unit}", tenths / 10, tenths % 10)
        }
    }

    /// Reads a byte count with an optional binary (`Ki`..`Ti`) or decimal
    /// (`K`..`T`) suffix.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let (number, unit) = split_unit(text);
        let scale: u64 = match unit {
            "" => 1,
            "K" | "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            _ => return Err(unknown(unit, MEMORY_UNITS)),
        };
        scaled(text, number, scale).map(Memory)
    }
}

impl std::str::FromStr for Duration {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(span: Duration) -> Self {
        std::time::Duration::from_millis(span.0)
    }
}

impl Duration {
    /// Reads `500ms`, `10s`, `5m`, `1h` or `1d`; a unit is required so that
    /// `timeout 5` is never silently five milliseconds.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let (number, unit) = split_unit(text);
        let scale: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(unknown(unit, DURATION_UNITS)),
        };
        scaled(text, number, scale).map(Duration)
    }

    /// Whole seconds, rounded down.
    pub fn as_secs(self) -> u64 {
        self.0 / 1000
    }
}

impl Percent {
    /// Reads `70%`. The sign is required so a bare `70` is never mistaken
    /// for a count.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let (number, unit) = split_unit(text);
        if unit != "%" {
            return Err(unknown(unit, PERCENT_UNITS));
        }
        let value = scaled(text, number, 1)?;
        u32::try_from(value)
            .map(Percent)
            .map_err(|_| QuantityError::Overflow(text.to_owned()))
    }
}

fn unknown(unit: &str, expected: &'static [&'static str]) -> QuantityError {
    QuantityError::UnknownUnit {
        unit: if unit.is_empty() {
            "(none)".to_owned()
        } else {
            unit.to_owned()
        },
        expected,
    }
}

/// Splits `256Mi` into `("256", "Mi")`.
fn split_unit(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    text.split_at(end)
}

/// `number * scale`, exact: a fraction that does not land on a whole unit
/// (`0.0001` cores) is refused rather than rounded.
fn scaled(text: &str, number: &str, scale: u64) -> Result<u64, QuantityError> {
    let not_a_number = || QuantityError::NotANumber(text.to_owned());
    let overflow = || QuantityError::Overflow(text.to_owned());
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits_only(whole) || !digits_only(fraction) {
        return Err(not_a_number());
    }
    if number.ends_with('.') {
        return Err(not_a_number());
    }
    let whole: u64 = whole.parse().map_err(|_| overflow())?;
    let value = whole.checked_mul(scale).ok_or_else(overflow)?;
    if fraction.is_empty() {
        return Ok(value);
    }
    let too_precise = || QuantityError::TooPrecise(text.to_owned());
    let exponent = u32::try_from(fraction.len()).map_err(|_| too_precise())?;
    let denominator = 10u128.checked_pow(exponent).ok_or_else(too_precise)?;
    let numerator: u128 = fraction.parse().map_err(|_| too_precise())?;
    let scaled_fraction = numerator * u128::from(scale);
    if !scaled_fraction.is_multiple_of(denominator) {
        return Err(too_precise());
    }
    let fraction_value = u64::try_from(scaled_fraction / denominator).map_err(|_| overflow())?;
    let value = value.checked_add(fraction_value).ok_or_else(overflow)?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_reads_millicores_and_cores() {
        assert_eq!(Cpu::parse("500m"), Ok(Cpu(500)));
        assert_eq!(Cpu::parse("2"), Ok(Cpu(2000)));
        assert_eq!(Cpu::parse("1.5"), Ok(Cpu(1500)));
        assert_eq!(
            Cpu::parse("0.0001"),
            Err(QuantityError::TooPrecise("0.0001".into()))
        );
        assert!(matches!(
            Cpu::parse("2Gi"),
            Err(QuantityError::UnknownUnit { .. })
        ));
    }

    #[test]
    fn memory_reads_for_people_in_binary_units_with_one_decimal() {
        let human = |bytes: u64| Memory(bytes).human();
        assert_eq!(human(384 << 20), "384Mi");
        // 24683652Ki, as /proc/meminfo reports a 23.5 GiB machine.
        assert_eq!(human(24_683_652 << 10), "23.5Gi");
        assert_eq!(human(1536 << 20), "1.5Gi");
        assert_eq!(human(3 << 30), "3Gi");
        assert_eq!(human((1 << 30) - 1), "1Gi");
        assert_eq!(human((1 << 20) + (1 << 10)), "1Mi");
        assert_eq!(human(5 << 40), "5Ti");
        assert_eq!(human(2048 << 40), "2048Ti");
        assert_eq!(human(1 << 10), "1Ki");
        assert_eq!(human(100), "100B");
        assert_eq!(human(0), "0B");
        assert_eq!(human(u64::MAX), "16777216Ti");
    }

    #[test]
    fn memory_reads_binary_and_decimal_suffixes() {
        assert_eq!(Memory::parse("256Mi"), Ok(Memory(256 << 20)));
        assert_eq!(Memory::parse("1.5Gi"), Ok(Memory(3 << 29)));
        assert_eq!(Memory::parse("512M"), Ok(Memory(512_000_000)));
        assert_eq!(Memory::parse("1024"), Ok(Memory(1024)));
        assert_eq!(
            Memory::parse("99999999999999999999Ti"),
            Err(QuantityError::Overflow("99999999999999999999Ti".into()))
        );
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(Duration::parse("10s"), Ok(Duration(10_000)));
        assert_eq!(Duration::parse("5m"), Ok(Duration(300_000)));
        assert_eq!(Duration::parse("250ms"), Ok(Duration(250)));
        let err = Duration::parse("5").expect_err("no unit");
        assert_eq!(
            err.to_string(),
            "unknown unit `(none)`; expected one of: ms, s, m, h, d"
        );
    }

    #[test]
    fn percent_needs_the_sign() {
        assert_eq!(Percent::parse("70%"), Ok(Percent(70)));
        assert!(Percent::parse("70").is_err());
        assert_eq!(
            Percent::parse("%"),
            Err(QuantityError::NotANumber("%".into()))
        );
    }
}
