//! What an answer shows of the target's insides, recognised by what it is —
//! a stack frame or a traceback's header of a common runtime, an absolute
//! path to a source file, SQL error text, a framework's debug page — in any
//! answer of any status, wherever the target happens to be installed. An
//! order's own members (ids, paths such as `/v1/orders/…`, URLs) are not
//! internals: every pattern needs the shape of a frame, a source file with
//! its line, a database's own wording or a debug page's own text.

use std::sync::OnceLock;

use regex_lite::Regex;

/// One kind of internal: what it is, and the pattern that finds it.
struct Kind {
    what: &'static str,
    pattern: &'static str,
}

/// Every kind, the most telling first (the first that matches names it).
const KINDS: &[Kind] = &[
    // Node: `at fn (/abs/path.js:106:65)`, `at /abs/path.js:4:70`, `node:internal/…`.
    Kind {
        what: "a Node stack frame",
        pattern: r"\bat (?:async )?(?:[^\s()<>]+(?: \[as [^\]]+\])? \()?(?:file://)?(?:/|[A-Za-z]:\\)[^\s()<>:]+\.(?:js|mjs|cjs|ts|jsx|tsx):\d+:\d+\)?",
    },
    Kind {
        what: "a Node module path",
        pattern: r"(?:/node_modules/[^\s<>]+\.(?:js|mjs|cjs)\b|\(node:internal/[\w/]+:\d+)",
    },
    // Python: the traceback's header and its frames.
    Kind {
        what: "a Python traceback",
        pattern: r"Traceback \(most recent call last\)|Traceback <em>\(most recent call last\)",
    },
    Kind {
        what: "a Python stack frame",
        pattern: r#"File "[^"\n]+", line \d+, in "#,
    },
    // Java and the JVM's languages.
    Kind {
        what: "a Java stack frame",
        pattern: r"\bat (?:[\w$]+\.)+[\w$<>]+\((?:[\w$]+\.(?:java|kt|scala|groovy|clj):\d+|Native Method|Unknown Source)\)",
    },
    Kind {
        what: "a Java exception",
        pattern: r#"Exception in thread "|\b(?:java|javax|jakarta)\.(?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error)\b|\borg\.(?:springframework|hibernate|apache)\.(?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error)\b"#,
    },
    // Go.
    Kind {
        what: "a Go goroutine dump",
        pattern: r"goroutine \d+ \[[\w ,]+\]:",
    },
    Kind {
        what: "a Go stack frame",
        pattern: r"\.go:\d+ \+0x[0-9a-f]+",
    },
    // PHP.
    Kind {
        what: "a PHP error",
        pattern: r"(?:Fatal error|Parse error|Warning|Notice|Deprecated)(?:</b>)?:\s+.{0,300}? in (?:<b>)?(?:/|[A-Za-z]:\\)[^\s<>]+\.php(?:</b>)?(?: on line |:)(?:<b>)?\d+|(?:PHP )?Fatal error(?:</b>)?:\s+Uncaught ",
    },
    Kind {
        what: "a PHP stack trace",
        pattern: r"#\d+ (?:/|[A-Za-z]:\\)[^\s<>()]+\.php\(\d+\)",
    },
    // Ruby.
    Kind {
        what: "a Ruby stack frame",
        pattern: r"[\w./-]+\.rb:\d+:in [`']",
    },
    // .NET.
    Kind {
        what: "a .NET stack frame",
        pattern: r"\bat [\w.`<>\[\]+]+\([^()\n]*\) in [^\n]+\.(?:cs|vb|fs):line \d+|\bat (?:System|Microsoft)\.[\w.`<>\[\]+]+\(",
    },
    Kind {
        what: "an ASP.NET error page",
        pattern: r"Server Error in '[^']*' Application|An unhandled exception occurred while processing the request",
    },
    // Rust.
    Kind {
        what: "a Rust panic",
        pattern: r"panicked at [^\s:]+\.rs:\d+:\d+|thread '[^']*'(?: \(\d+\))? panicked at ",
    },
    // SQL error text.
    Kind {
        what: "SQL error text",
        pattern: r#"\bSQLSTATE\b|syntax error at or near "|\bSQLITE_[A-Z]+\b|duplicate key value violates unique constraint|(?:UNIQUE|NOT NULL|FOREIGN KEY|CHECK) constraint failed: |near "[^"\n]*": syntax error|You have an error in your SQL syntax|\bORA-\d{5}\b|(?:relation|column) "[^"\n]+" (?:of relation "[^"\n]+" )?does not exist|\bsqlite3\.(?:Integrity|Operational|Programming)Error\b|\bpsycopg2?\.errors\.|\bsqlalchemy\.exc\.|\bSequelize(?:Database|UniqueConstraint)Error\b|\bER_[A-Z_]+:"#,
    },
    // Frameworks' debug pages.
    Kind {
        what: "a Django debug page",
        pattern: r"DEBUG = True</code>|you have <code>DEBUG = True",
    },
    Kind {
        what: "a Werkzeug debugger page",
        pattern: r"Werkzeug Debugger|The debugger caught an exception in your WSGI application",
    },
    Kind {
        what: "a Rails debug page",
        pattern: r"Action Controller: Exception caught|Rails\.root: ",
    },
    Kind {
        what: "a Laravel or Symfony debug page",
        pattern: r"\bIlluminate\\[A-Z]\w+\\|\bSymfony\\Component\\[A-Z]\w+\\|Whoops, looks like something went wrong",
    },
    // An absolute path to a source file with its line, on any system.
    Kind {
        what: "a source file's path",
        pattern: r"(?:^|[\s(\[:=])(?:/[\w.@-]+){2,}\.(?:js|mjs|cjs|ts|py|rb|php|java|kt|scala|go|rs|cs|vb|ex|exs|erl|pl|pm|lua|c|cc|cpp|h)(?::\d+|\(\d+\)|, line \d+| line \d+)|[A-Za-z]:\\(?:[\w .-]+\\)+[\w.-]+\.(?:cs|vb|fs|js|ts|py|java|php|go|rs|cpp|c|h)\b",
    },
    // A path under a system's usual places for code.
    Kind {
        what: "an absolute path on the server",
        pattern: r"(?:^|[\s(\[:='])/(?:home|Users|root|srv|opt|var/www|var/lib|usr/local/lib|usr/lib|usr/share|app/node_modules)/[\w.@-]+/[\w.@/-]+",
    },
];

fn compiled() -> &'static [(&'static str, Regex)] {
    static COMPILED: OnceLock<Vec<(&'static str, Regex)>> = OnceLock::new();
    COMPILED.get_or_init(|| {
        KINDS
            .iter()
            // The patterns are constants, checked by the tests below.
            .filter_map(|k| Regex::new(k.pattern).ok().map(|r| (k.what, r)))
            .collect()
    })
}

/// What `text` shows of the target's insides, if anything: the kind of
/// internal and the text that shows it (at most 120 characters).
pub fn find(text: &str) -> Option<(&'static str, String)> {
    compiled().iter().find_map(|(what, pattern)| {
        pattern.find(text).map(|m| {
            let shown: String = m.as_str().trim().chars().take(120).collect();
            (*what, shown)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each fixture, with the kind of internal it must be found as. The
    /// Node, Express, Python, Java, Rust, SQLite and PostgreSQL samples
    /// are real output; the rest follow the documented formats.
    const SAMPLES: &[(&str, &str, &str)] = &[
        (
            "node-stack.txt",
            include_str!("../tests/fixtures/internals/node-stack.txt"),
            "a Node stack frame",
        ),
        (
            "express-500.html",
            include_str!("../tests/fixtures/internals/express-500.html"),
            "a Node stack frame",
        ),
        (
            "python-traceback.txt",
            include_str!("../tests/fixtures/internals/python-traceback.txt"),
            "a Python traceback",
        ),
        (
            "java-exception.txt",
            include_str!("../tests/fixtures/internals/java-exception.txt"),
            "a Java stack frame",
        ),
        (
            "go-panic.txt",
            include_str!("../tests/fixtures/internals/go-panic.txt"),
            "a Go goroutine dump",
        ),
        (
            "php-fatal.html",
            include_str!("../tests/fixtures/internals/php-fatal.html"),
            "a PHP error",
        ),
        (
            "ruby-error.txt",
            include_str!("../tests/fixtures/internals/ruby-error.txt"),
            "a Ruby stack frame",
        ),
        (
            "dotnet-exception.txt",
            include_str!("../tests/fixtures/internals/dotnet-exception.txt"),
            "a .NET stack frame",
        ),
        (
            "rust-panic.txt",
            include_str!("../tests/fixtures/internals/rust-panic.txt"),
            "a Rust panic",
        ),
        (
            "sqlite-error.txt",
            include_str!("../tests/fixtures/internals/sqlite-error.txt"),
            "a Python traceback",
        ),
        (
            "postgres-error.txt",
            include_str!("../tests/fixtures/internals/postgres-error.txt"),
            "SQL error text",
        ),
        (
            "mysql-error.txt",
            include_str!("../tests/fixtures/internals/mysql-error.txt"),
            "SQL error text",
        ),
        (
            "django-debug.html",
            include_str!("../tests/fixtures/internals/django-debug.html"),
            "a Django debug page",
        ),
        (
            "werkzeug-debugger.html",
            include_str!("../tests/fixtures/internals/werkzeug-debugger.html"),
            "a Python traceback",
        ),
        (
            "rails-debug.html",
            include_str!("../tests/fixtures/internals/rails-debug.html"),
            "a Rails debug page",
        ),
        (
            "laravel-debug.html",
            include_str!("../tests/fixtures/internals/laravel-debug.html"),
            "a PHP stack trace",
        ),
        (
            "symfony-debug.html",
            include_str!("../tests/fixtures/internals/symfony-debug.html"),
            "a Laravel or Symfony debug page",
        ),
        (
            "aspnet-ysod.html",
            include_str!("../tests/fixtures/internals/aspnet-ysod.html"),
            "an ASP.NET error page",
        ),
    ];

    #[test]
    fn every_pattern_compiles() {
        assert_eq!(compiled().len(), KINDS.len());
    }

    #[test]
    fn each_runtime_s_and_framework_s_sample_is_found_as_what_it_is() {
        for (file, text, kind) in SAMPLES {
            let found = find(text);
            assert_eq!(
                found.as_ref().map(|f| f.0),
                Some(*kind),
                "{file}: {found:?}"
            );
        }
    }

    #[test]
    fn each_sample_is_found_by_its_lines_alone_wherever_it_was_cut() {
        // A frame alone, as an answer that shows one line of a trace.
        for (line, kind) in [
            (
                "    at total (/tmp/samples/orders-common.js:1:44)",
                "a Node stack frame",
            ),
            (
                r#"  File "/tmp/samples/orders_app.py", line 2, in total"#,
                "a Python stack frame",
            ),
            (
                "\tat com.shop.Orders.total(Orders.java:3)",
                "a Java stack frame",
            ),
            ("\t/home/build/orders/main.go:12 +0x1c", "a Go stack frame"),
            (
                "#0 /var/www/html/orders.php(21): total(NULL)",
                "a PHP stack trace",
            ),
            (
                r"   at Orders.Api.OrderService.Total(Order order) in C:\src\Orders.Api\OrderService.cs:line 12",
                "a .NET stack frame",
            ),
            (
                "thread 'main' panicked at src/main.rs:1:97:",
                "a Rust panic",
            ),
            (
                r#"{"error":"SQLITE_CONSTRAINT: UNIQUE constraint failed: orders.key"}"#,
                "SQL error text",
            ),
            (
                r#"{"detail":"see /home/deploy/orders/config/settings.yml"}"#,
                "an absolute path on the server",
            ),
            (
                r#"{"error":"failed at /tmp/build/lib/orders.ex:12"}"#,
                "a source file's path",
            ),
        ] {
            assert_eq!(find(line).map(|f| f.0), Some(kind), "{line}");
        }
    }

    #[test]
    fn ordinary_answers_show_no_internals() {
        for body in [
            r#"{"id":"0193a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b","item":"atk-1a2b3c4d","quantity":2,"price":"9.99","status":"pending"}"#,
            r#"{"type":"https://orders.example/problems/validation","title":"Validation failed","status":422,"detail":"quantity must be an integer at least 1","instance":"/v1/orders/0193a1b2-7c3d","errors":[{"field":"quantity","message":"must be at least 1"}]}"#,
            r#"{"error":"NOT_FOUND","path":"/v1/orders/42","docs":"https://docs.example.com/errors/not-found.html"}"#,
            r#"{"error":"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD","message":"the key was used at /v1/orders with another body"}"#,
            "<!DOCTYPE html><html><head><title>Error</title><script src=\"/static/js/main.4f2c.js\"></script></head><body><pre>Cannot DELETE /orders/7</pre></body></html>",
            "<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx/1.24.0</center></body></html>",
            r#"{"message":"Internal Server Error","error":"something went wrong, please try again at 12:30"}"#,
            r#"{"item":"pen at home","note":"a syntax error in your request","sql":"select"}"#,
        ] {
            assert_eq!(find(body), None, "{body}");
        }
    }
}
