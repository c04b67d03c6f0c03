//! The exact value of a JSON number literal, for money.
//!
//! `serde_json` (with `arbitrary_precision`) hands over a number's text as
//! the client wrote it: any length, any exponent. [`Amount::read`] first
//! reduces the text to its significant digits and a power of ten, with
//! checked arithmetic on the exponent, so that a literal such as
//! `1e99999999999999999999` or a 400-digit `0.000…0001` is classified
//! without ever being expanded; what fits a [`Decimal`] exactly is then
//! handed to `rust_decimal`, which never sees a literal it would round.

use json_number::{Exponent, Scientific};
use rust_decimal::Decimal;

/// What a number literal denotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// The literal's exact value.
    Exact(Decimal),
    /// A nonzero value no `Decimal` can hold exactly (more than 28
    /// significant digits, or a magnitude of 10^28 or more, or digits below
    /// 10^-28). `below_cents`: it has a nonzero digit below 10^-2; when it
    /// has none, its magnitude is at least 10^26.
    Beyond { negative: bool, below_cents: bool },
}

/// `validator` records a failing value with its error; an amount is
/// recorded as its decimal text (or `"beyond"`), never as a float.
impl serde::Serialize for Amount {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Amount::Exact(d) => serializer.collect_str(d),
            Amount::Beyond { .. } => serializer.serialize_str("beyond"),
        }
    }
}

impl Amount {
    /// The exact value of a JSON number's text; `None` when the text is not
    /// JSON number grammar.
    pub fn read(text: &str) -> Option<Self> {
        let s = Scientific::read(text)?;
        if s.is_zero() {
            return Some(Amount::Exact(Decimal::ZERO));
        }
        let beyond = |below_cents| Amount::Beyond {
            negative: s.negative,
            below_cents,
        };
        let exponent = match s.exponent {
            Exponent::Small(e) => e,
            Exponent::Huge { negative, .. } => return Some(beyond(negative)),
        };
        let max_scale = i128::from(Decimal::MAX_SCALE);
        let len = i128::try_from(s.digits.len()).unwrap_or(i128::MAX);
        // Within reach: at most 28 digits, none below 10^-28, below 10^28.
        if len > max_scale || exponent < -max_scale || len.saturating_add(exponent) > max_scale {
            return Some(beyond(exponent < -2));
        }
        let sign = if s.negative { "-" } else { "" };
        Some(
            Decimal::from_scientific(&format!("{sign}{}e{exponent}", s.digits))
                .map_or(beyond(exponent < -2), Amount::Exact),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(text: &str) -> Option<String> {
        match Amount::read(text) {
            Some(Amount::Exact(d)) => Some(d.normalize().to_string()),
            _ => None,
        }
    }

    #[test]
    fn literals_within_reach_are_read_exactly() {
        assert_eq!(exact("9.990").as_deref(), Some("9.99"));
        assert_eq!(exact("1e2").as_deref(), Some("100"));
        assert_eq!(exact("1E+2").as_deref(), Some("100"));
        assert_eq!(exact("-0.00").as_deref(), Some("0"));
        assert_eq!(exact("0.1E1").as_deref(), Some("1"));
        assert_eq!(exact("123.45e-1").as_deref(), Some("12.345"));
    }

    #[test]
    fn zero_is_zero_whatever_its_exponent() {
        for zero in [
            "0e99999999999999999999",
            "0E-99999999999999999999",
            "-0.000e+1",
            &format!("0.{}", "0".repeat(400)),
        ] {
            assert_eq!(exact(zero).as_deref(), Some("0"), "{zero}");
        }
    }

    #[test]
    fn long_mantissas_are_reduced_to_their_significant_digits() {
        let billion = format!("1{}e-390", "0".repeat(399));
        assert_eq!(exact(&billion).as_deref(), Some("1000000000"));
        let tiny = format!("0.{}1", "0".repeat(399));
        assert_eq!(
            Amount::read(&tiny),
            Some(Amount::Beyond {
                negative: false,
                below_cents: true
            })
        );
    }

    #[test]
    fn exponents_of_any_length_are_classified_never_misread() {
        let big = Some(Amount::Beyond {
            negative: false,
            below_cents: false,
        });
        let small = Some(Amount::Beyond {
            negative: false,
            below_cents: true,
        });
        assert_eq!(Amount::read("1e99999999999999999999"), big);
        assert_eq!(Amount::read("1E+99999999999999999999"), big);
        assert_eq!(Amount::read("1e-99999999999999999999"), small);
        assert_eq!(Amount::read(&format!("1e{}", "9".repeat(60))), big);
        assert_eq!(Amount::read("1e29"), big);
        assert_eq!(Amount::read("1e-29"), small);
        assert_eq!(
            Amount::read("-1e170141183460469231731687303715884105727"),
            Some(Amount::Beyond {
                negative: true,
                below_cents: false
            })
        );
    }

    #[test]
    fn text_that_is_not_json_number_grammar_is_not_read() {
        for bad in [
            "", "-", "01", "1.", ".5", "1e", "1e+", "+1", "1x", "NaN", "--1",
        ] {
            assert_eq!(Amount::read(bad), None, "{bad}");
        }
    }
}
