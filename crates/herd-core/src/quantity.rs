//! Resource quantities as people write them (Kubernetes' notation): CPU in
//! cores or millicores (`2`, `1.5`, `500m`), bytes with a binary or
//! decimal suffix (`512Mi`, `1G`, `1048576`). Each parses to a whole
//! number of its unit and prints back canonically; text that is not one
//! is refused naming what is wrong.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// CPU, in thousandths of a core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millicores(pub u64);

/// A size in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

/// Why a quantity's text is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("is empty")]
    Empty,
    #[error("{0:?} is negative: a quantity is zero or more")]
    Negative(String),
    #[error("{text:?} is not a number with an optional suffix ({suffixes})")]
    Malformed { text: String, suffixes: &'static str },
    #[error("{text:?} is not a whole number of {unit}")]
    Fraction { text: String, unit: &'static str },
    #[error("{0:?} is too large")]
    TooLarge(String),
}

const CPU_SUFFIXES: &str = "m for millicores, none for cores";
const BYTE_SUFFIXES: &str = "Ki, Mi, Gi, Ti, Pi, Ei, or k, M, G, T, P, E";

/// `text` as a decimal number times `scale`, which must come out whole.
fn scaled(
    text: &str,
    number: &str,
    scale: u128,
    unit: &'static str,
    suffixes: &'static str,
) -> Result<u64, QuantityError> {
    let malformed = || QuantityError::Malformed { text: text.to_string(), suffixes };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !digits(whole) || !digits(fraction) || number.ends_with('.') {
        return Err(malformed());
    }
    let too_large = || QuantityError::TooLarge(text.to_string());
    // Trailing zeros of the fraction say nothing; more than 30 digits of
    // anything else are no quantity.
    let fraction = fraction.trim_end_matches('0');
    if whole.len() + fraction.len() > 30 {
        return Err(too_large());
    }
    let mantissa: u128 = format!("{whole}{fraction}").parse().unwrap_or(0);
    let divisor = 10u128.pow(fraction.len() as u32);
    let value = mantissa.checked_mul(scale).ok_or_else(too_large)?;
    if value % divisor != 0 {
        return Err(QuantityError::Fraction { text: text.to_string(), unit });
    }
    u64::try_from(value / divisor).map_err(|_| too_large())
}

fn checked(text: &str) -> Result<&str, QuantityError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(QuantityError::Empty);
    }
    if text.starts_with('-') {
        return Err(QuantityError::Negative(text.to_string()));
    }
    Ok(text.strip_prefix('+').unwrap_or(text))
}

impl FromStr for Millicores {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bare = checked(text)?;
        let (number, scale) = match bare.strip_suffix('m') {
            Some(number) => (number, 1),
            None => (bare, 1000),
        };
        scaled(text.trim(), number, scale, "millicores", CPU_SUFFIXES).map(Millicores)
    }
}

impl FromStr for Bytes {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        const SUFFIXES: [(&str, u128); 12] = [
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("Pi", 1 << 50),
            ("Ei", 1 << 60),
            ("k", 1_000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
            ("P", 1_000_000_000_000_000),
            ("E", 1_000_000_000_000_000_000),
        ];
        let bare = checked(text)?;
        let (number, scale) =
            SUFFIXES.iter().find_map(|(suffix, scale)| Some((bare.strip_suffix(suffix)?, *scale))).unwrap_or((bare, 1));
        scaled(text.trim(), number, scale, "bytes", BYTE_SUFFIXES).map(Bytes)
    }
}

impl fmt::Display for Millicores {
    /// Whole cores bare (`2`), anything else in millicores (`1500m`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 % 1000 {
            0 => write!(f, "{}", self.0 / 1000),
            _ => write!(f, "{}m", self.0),
        }
    }
}

impl fmt::Display for Bytes {
    /// In the largest binary unit that divides it (`512Mi`, `1536Ki`),
    /// bare when none does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
        for (i, unit) in UNITS.iter().enumerate() {
            let scale = 1u64 << (10 * (UNITS.len() - i));
            if self.0 != 0 && self.0.is_multiple_of(scale) {
                return write!(f, "{}{unit}", self.0 / scale);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Bytes {
    /// For people: in the largest binary unit it reaches, to one decimal
    /// (`3.5Gi`, `8Gi`, `900Mi`, `12`).
    pub fn approximate(&self) -> String {
        const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
        let Some(power) = (1..=UNITS.len()).rev().find(|p| self.0 >= 1u64 << (10 * p)) else {
            return self.0.to_string();
        };
        let tenths = (self.0 as f64 / (1u64 << (10 * power)) as f64 * 10.0).round() as u64;
        let unit = UNITS[power - 1];
        match tenths % 10 {
            0 => format!("{}{unit}", tenths / 10),
            rest => format!("{}.{rest}{unit}", tenths / 10),
        }
    }
}

/// Text or a bare number (YAML's `cpu: 2`), as written.
#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Text(String),
    Whole(u64),
    Signed(i64),
    Float(f64),
}

impl Written {
    fn text(self) -> String {
        match self {
            Written::Text(text) => text,
            Written::Whole(n) => n.to_string(),
            Written::Signed(n) => n.to_string(),
            Written::Float(n) => n.to_string(),
        }
    }
}

macro_rules! quantity_serde {
    ($kind:ty, $name:literal, $description:literal) => {
        impl Serialize for $kind {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $kind {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                Written::deserialize(deserializer)?.text().parse().map_err(serde::de::Error::custom)
            }
        }

        impl JsonSchema for $kind {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "type": ["string", "integer"], "description": $description })
            }
        }
    };
}

quantity_serde!(Millicores, "Cpu", "CPU: cores (2, 1.5) or millicores (500m)");
quantity_serde!(Bytes, "Bytes", "bytes, with a binary (512Mi, 2Gi) or decimal (100M) suffix, or none");

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cpu_in_cores_or_millicores() {
        for (text, millicores) in [("2", 2000), ("1.5", 1500), ("500m", 500), ("0.25", 250), ("0", 0), ("+1", 1000)] {
            assert_eq!(text.parse::<Millicores>(), Ok(Millicores(millicores)), "{text}");
        }
        assert_eq!("-1".parse::<Millicores>(), Err(QuantityError::Negative("-1".into())));
        assert_eq!(
            "0.0001".parse::<Millicores>(),
            Err(QuantityError::Fraction { text: "0.0001".into(), unit: "millicores" })
        );
        for bad in ["", " ", "m", "1.5.1", "one", "1 core", "1c", "1.", ".m", "0x10"] {
            assert!(bad.parse::<Millicores>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bytes_with_binary_or_decimal_suffixes() {
        let cases = [("512Mi", 512 << 20), ("1Gi", 1 << 30), ("100M", 100_000_000), ("1.5Ki", 1536), ("1024", 1024)];
        for (text, bytes) in cases {
            assert_eq!(text.parse::<Bytes>(), Ok(Bytes(bytes)), "{text}");
        }
        let error = "12XB".parse::<Bytes>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "\"12XB\" is not a number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, or k, M, G, T, P, E)"
        );
        assert!(matches!("0.5".parse::<Bytes>(), Err(QuantityError::Fraction { .. })));
        assert!(matches!("16Ei".parse::<Bytes>(), Err(QuantityError::TooLarge(_))));
        assert!(matches!("-1Mi".parse::<Bytes>(), Err(QuantityError::Negative(_))));
    }

    #[test]
    fn yaml_numbers_and_strings_read_alike_and_print_canonically() {
        assert_eq!(serde_json::from_str::<Millicores>("2").unwrap(), Millicores(2000));
        assert_eq!(serde_json::from_str::<Millicores>("0.5").unwrap(), Millicores(500));
        assert!(serde_json::from_str::<Millicores>("-1").unwrap_err().to_string().contains("negative"));
        assert_eq!(serde_json::to_string(&Bytes(512 << 20)).unwrap(), "\"512Mi\"");
        assert_eq!(serde_json::to_string(&Millicores(1500)).unwrap(), "\"1500m\"");
        assert_eq!(Bytes(1000).to_string(), "1000");
    }

    #[test]
    fn approximate_sizes_for_people() {
        let cases =
            [(12, "12"), (1536, "1.5Ki"), (900 << 20, "900Mi"), (8 << 30, "8Gi"), ((1 << 30) * 12 / 10, "1.2Gi")];
        for (bytes, shown) in cases {
            assert_eq!(Bytes(bytes).approximate(), shown);
        }
        assert_eq!(Bytes(u64::MAX).approximate(), "16Ei");
    }

    proptest! {
        #[test]
        fn what_prints_parses_back_to_itself(bytes in any::<u64>(), millicores in any::<u64>()) {
            prop_assert_eq!(Bytes(bytes).to_string().parse::<Bytes>(), Ok(Bytes(bytes)));
            prop_assert_eq!(Millicores(millicores).to_string().parse::<Millicores>(), Ok(Millicores(millicores)));
        }
    }
}
