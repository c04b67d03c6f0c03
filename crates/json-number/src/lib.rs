//! The exact value of a JSON number literal.
//!
//! A JSON parser that keeps a number's text (`serde_json` with
//! `arbitrary_precision`) hands over whatever the client wrote: any length,
//! any exponent. [`Scientific::read`] reduces that text to its significant
//! digits and a power of ten, with checked arithmetic on the exponent, so a
//! literal such as `1e99999999999999999999` or a 400-digit `0.000…0001` is
//! classified without ever being expanded. Two literals denote the same
//! value exactly when their readings are equal (zero aside, see
//! [`Scientific::is_zero`]).
//!
//! ```
//! use json_number::{Exponent, Scientific};
//!
//! let price = Scientific::read("9.990").unwrap_or_else(|| unreachable!());
//! assert_eq!(price.digits, "999");
//! assert_eq!(price.exponent, Exponent::Small(-2));
//! assert_eq!(Scientific::read("999e-2"), Some(price));
//! assert_eq!(Scientific::read("01"), None); // not JSON number grammar
//! ```

/// The significant digits of a literal and the power of ten they are
/// scaled by: `digits × 10^exponent`, `digits` without leading or trailing
/// zeros (empty for zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scientific<'a> {
    pub negative: bool,
    pub digits: String,
    pub exponent: Exponent<'a>,
}

/// A power of ten: exact when it fits `i128`; otherwise the written
/// exponent's sign and significant digits plus the shift the mantissa adds
/// (such a magnitude dwarfs any literal, and is never computed with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exponent<'a> {
    Small(i128),
    Huge {
        negative: bool,
        written: &'a str,
        shift: i128,
    },
}

impl<'a> Scientific<'a> {
    /// Reads JSON number grammar (RFC 8259 §6); `None` for anything else.
    pub fn read(text: &'a str) -> Option<Self> {
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        let (int_part, frac_part) = match mantissa.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (mantissa, None),
        };
        let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(int_part) || (int_part.len() > 1 && int_part.starts_with('0')) {
            return None;
        }
        if frac_part.is_some_and(|f| !all_digits(f)) {
            return None;
        }
        let frac_part = frac_part.unwrap_or("");
        let written_exponent = match exponent {
            None => Exponent::Small(0),
            Some(e) => {
                let (e_negative, e_digits) = match e.as_bytes().first() {
                    Some(b'-') => (true, &e[1..]),
                    Some(b'+') => (false, &e[1..]),
                    _ => (false, e),
                };
                if !all_digits(e_digits) {
                    return None;
                }
                let significant = e_digits.trim_start_matches('0');
                // 38 digits always fit i128 (whose range reaches 1.7 × 10^38).
                match significant.parse::<i128>() {
                    Ok(magnitude) if significant.len() <= 38 => {
                        Exponent::Small(if e_negative { -magnitude } else { magnitude })
                    }
                    _ if significant.is_empty() => Exponent::Small(0),
                    _ => Exponent::Huge {
                        negative: e_negative,
                        written: significant,
                        shift: 0,
                    },
                }
            }
        };
        let all = format!("{int_part}{frac_part}");
        let leading = all.len() - all.trim_start_matches('0').len();
        let significant = all.trim_matches('0');
        if significant.is_empty() {
            return Some(Self {
                negative,
                digits: String::new(),
                exponent: Exponent::Small(0),
            });
        }
        let trailing = all.len() - leading - significant.len();
        // digits × 10^(written - |frac| + trailing); the lengths are bounded
        // by the text, so the adjustment is small and checked.
        let shift = i128::try_from(trailing).ok()? - i128::try_from(frac_part.len()).ok()?;
        let exponent = match written_exponent {
            Exponent::Small(e) => match e.checked_add(shift) {
                Some(e) => Exponent::Small(e),
                None => Exponent::Huge {
                    negative: e < 0,
                    written: exponent
                        .unwrap_or("")
                        .trim_start_matches(['+', '-'])
                        .trim_start_matches('0'),
                    shift,
                },
            },
            Exponent::Huge {
                negative, written, ..
            } => Exponent::Huge {
                negative,
                written,
                shift,
            },
        };
        Some(Self {
            negative,
            digits: significant.to_owned(),
            exponent,
        })
    }

    /// Whether the value is zero (whatever its exponent: `0e99999999999999999999` is 0).
    pub fn is_zero(&self) -> bool {
        self.digits.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_is_reduced_to_its_significant_digits_and_power_of_ten() {
        let read = |t| Scientific::read(t).map(|s| (s.negative, s.digits, s.exponent));
        assert_eq!(
            read("9.990"),
            Some((false, "999".into(), Exponent::Small(-2)))
        );
        assert_eq!(read("-1200"), Some((true, "12".into(), Exponent::Small(2))));
        assert_eq!(
            read("0.0012e3"),
            Some((false, "12".into(), Exponent::Small(-1)))
        );
        assert_eq!(
            read("0e99999999999999999999"),
            Some((false, String::new(), Exponent::Small(0)))
        );
    }

    #[test]
    fn an_exponent_beyond_i128_is_kept_as_written_never_computed() {
        let huge = format!("1e{}", "9".repeat(60));
        let Some(s) = Scientific::read(&huge) else {
            unreachable!("JSON number grammar")
        };
        assert!(matches!(
            s.exponent,
            Exponent::Huge {
                negative: false,
                shift: 0,
                ..
            }
        ));
        assert_eq!(
            Scientific::read("10e-99999999999999999999999999999999999999999").map(|s| s.digits),
            Some("1".into())
        );
    }

    #[test]
    fn text_that_is_not_json_number_grammar_is_not_read() {
        for bad in [
            "", "-", "01", "1.", ".5", "1e", "1e+", "+1", "1x", "NaN", "--1", "1.e2",
        ] {
            assert_eq!(Scientific::read(bad), None, "{bad}");
        }
    }
}
