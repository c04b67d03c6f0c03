//! Writing a report, and the text forms every report shares: JSON and XML
//! escaping.

use std::io::Write as _;
use std::path::Path;

use crate::{AtkError, Format};

/// Writes a report: `render(format)` to `out`, and then the `text` report to
/// stdout; without `out`, `render(format)` to stdout.
pub fn emit(
    text: &str,
    render: &dyn Fn(Format) -> String,
    format: Format,
    out: Option<&Path>,
) -> Result<(), AtkError> {
    let mut stdout = std::io::stdout().lock();
    let stdout_error = |source| AtkError::Write {
        path: "stdout".into(),
        source,
    };
    match out {
        Some(path) => {
            std::fs::write(path, render(format)).map_err(|source| AtkError::Write {
                path: path.display().to_string(),
                source,
            })?;
            writeln!(stdout, "report written to {}", path.display()).map_err(stdout_error)?;
            stdout.write_all(text.as_bytes()).map_err(stdout_error)?;
        }
        None => stdout
            .write_all(render(format).as_bytes())
            .map_err(stdout_error)?,
    }
    stdout.flush().map_err(stdout_error)
}

/// A report as pretty JSON, with a final newline.
pub fn json(report: &impl serde::Serialize) -> String {
    // A report is plain data: serializing it cannot fail.
    let mut json = serde_json::to_string_pretty(report).unwrap_or_default();
    json.push('\n');
    json
}

/// Text as XML character data or an attribute value; characters XML 1.0
/// cannot hold become U+FFFD.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_drops_what_xml_cannot_hold() {
        assert_eq!(
            xml("<a href=\"x\">'&'</a>\u{1}\t"),
            "&lt;a href=&quot;x&quot;&gt;&apos;&amp;&apos;&lt;/a&gt;\u{FFFD}\t"
        );
    }
}
