//! The two backends' schemas stay equivalent: the same tables, the same
//! columns, the same nullability, in the migrations and in both modules of
//! `src/db/schema.rs`. Needs no PostgreSQL server: the SQLite migrations are
//! applied to a temporary file and read back (`PRAGMA table_info`); the
//! PostgreSQL migrations are read as text (the `CREATE TABLE` and
//! `ALTER TABLE` forms they use); the `table!` definitions are read through
//! diesel (the columns of `all_columns`, their SQL types).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use diesel::prelude::*;
use diesel::query_builder::QueryFragment;
use diesel::sql_types::{Integer, Text};
use diesel::{Table, debug_query};
use idempotency_ledger::schema as ledger;
use orders_api::db::schema::{pg, sqlite};
use orders_api::db::{DatabaseUrl, run_migrations};

/// Table → column → nullable, columns in their declared order.
type Schema = BTreeMap<String, Vec<(String, bool)>>;

/// One `table!` definition: its columns in `all_columns` order (read from
/// the SQL diesel writes for selecting them) and whether each is nullable
/// (read from the tuple of their SQL types).
fn diesel_table<T, DB>(name: &str) -> (String, Vec<(String, bool)>)
where
    T: Table + Default + diesel::query_dsl::methods::SelectDsl<T::AllColumns>,
    <T as diesel::query_dsl::methods::SelectDsl<T::AllColumns>>::Output: QueryFragment<DB>,
    DB: diesel::backend::Backend + Default,
    DB::QueryBuilder: Default,
{
    let select = diesel::query_dsl::methods::SelectDsl::select(T::default(), T::all_columns());
    let sql = debug_query::<DB, _>(&select).to_string();
    let list = sql
        .strip_prefix("SELECT ")
        .and_then(|rest| rest.split(" FROM ").next())
        .unwrap_or_else(|| panic!("unexpected SQL for {name}: {sql}"));
    let names: Vec<String> = list
        .split(", ")
        .map(|qualified| {
            let column = qualified.rsplit('.').next().unwrap_or(qualified);
            column.trim_matches(['"', '`']).to_owned()
        })
        .collect();
    let types = std::any::type_name::<<T::AllColumns as Expression>::SqlType>();
    let nullable: Vec<bool> = top_level_elements(types)
        .iter()
        .map(|t| t.contains("Nullable<"))
        .collect();
    assert_eq!(names.len(), nullable.len(), "{name}: {sql} / {types}");
    (name.to_owned(), names.into_iter().zip(nullable).collect())
}

/// The elements of a tuple type's name, split at its top-level commas.
fn top_level_elements(tuple: &str) -> Vec<String> {
    let inner = tuple
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or(tuple);
    let mut elements = vec![String::new()];
    let mut depth = 0usize;
    for ch in inner.chars() {
        match ch {
            '<' | '(' => depth += 1,
            '>' | ')' => depth -= 1,
            ',' if depth == 0 => {
                elements.push(String::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = elements.last_mut() {
            last.push(ch);
        }
    }
    elements
        .into_iter()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect()
}

fn sqlite_module() -> Schema {
    use diesel::sqlite::Sqlite;
    [
        diesel_table::<sqlite::api_keys::table, Sqlite>("api_keys"),
        diesel_table::<sqlite::orders::table, Sqlite>("orders"),
        diesel_table::<ledger::sqlite::idempotency_ledger::table, Sqlite>("idempotency_ledger"),
    ]
    .into_iter()
    .collect()
}

fn pg_module() -> Schema {
    use diesel::pg::Pg;
    [
        diesel_table::<pg::api_keys::table, Pg>("api_keys"),
        diesel_table::<pg::orders::table, Pg>("orders"),
        diesel_table::<ledger::pg::idempotency_ledger::table, Pg>("idempotency_ledger"),
    ]
    .into_iter()
    .collect()
}

/// Every table the SQLite migrations leave, as SQLite itself describes it.
fn sqlite_migrated() -> Schema {
    #[derive(QueryableByName)]
    struct TableName {
        #[diesel(sql_type = Text)]
        name: String,
    }
    #[derive(QueryableByName)]
    struct ColumnInfo {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Integer)]
        notnull: i32,
        #[diesel(sql_type = Integer)]
        pk: i32,
    }

    let path = std::env::temp_dir().join(format!("schema-parity-{}.db", uuid::Uuid::new_v4()));
    let url = DatabaseUrl::parse(&format!("sqlite://{}", path.display())).expect("url");
    run_migrations(&url).expect("apply the SQLite migrations");
    let mut conn = SqliteConnection::establish(url.as_str()).expect("open");
    let tables: Vec<TableName> = diesel::sql_query(
        "SELECT name FROM sqlite_master WHERE type = 'table' \
         AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '__diesel%' ORDER BY name",
    )
    .load(&mut conn)
    .expect("tables");
    let schema = tables
        .into_iter()
        .map(|table| {
            let columns: Vec<ColumnInfo> =
                diesel::sql_query(format!("PRAGMA table_info(\"{}\")", table.name))
                    .load(&mut conn)
                    .expect("columns");
            let columns = columns
                .into_iter()
                // An INTEGER PRIMARY KEY is the rowid: never NULL.
                .map(|c| (c.name, c.notnull == 0 && c.pk == 0))
                .collect();
            (table.name, columns)
        })
        .collect();
    drop(conn);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    schema
}

/// The PostgreSQL migrations, read as text in the order diesel applies them:
/// `CREATE TABLE`, `DROP TABLE`, and `ALTER TABLE` with `ADD COLUMN`,
/// `DROP COLUMN`, `ALTER COLUMN … SET/DROP NOT NULL` and `RENAME TO`. A
/// statement on a table in any other form fails the test, so that it is
/// taught the form rather than ignoring it.
fn pg_migrated() -> Schema {
    let mut schema = Schema::new();
    for up in migration_files(Path::new("migrations/postgres")) {
        let text = std::fs::read_to_string(&up).expect("read migration");
        let text: String = text
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for statement in text.split(';') {
            let words: Vec<&str> = statement.split_whitespace().collect();
            let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
            match upper
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice()
            {
                ["CREATE", "TABLE", ..] => {
                    let (name, columns) = pg_create_table(statement);
                    schema.insert(name, columns);
                }
                ["DROP", "TABLE", ..] => {
                    schema.remove(words[words.len() - 1]);
                }
                ["ALTER", "TABLE", ..] => pg_alter_table(&mut schema, statement, &up),
                ["CREATE", ..] | ["DELETE", ..] | ["UPDATE", ..] | ["INSERT", ..] | [] => {}
                _ => panic!("{}: cannot read {statement:?}", up.display()),
            }
        }
    }
    schema
}

fn migration_files(folder: &Path) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
    let mut ups: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("migrations folder")
        .map(|e| e.expect("entry").path().join("up.sql"))
        .collect();
    ups.sort();
    ups
}

/// The parts of `text` between top-level commas (not inside parentheses).
fn top_level_parts(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(text[start..].trim());
    parts
}

fn pg_create_table(statement: &str) -> (String, Vec<(String, bool)>) {
    let open = statement.find('(').expect("CREATE TABLE (");
    let close = statement.rfind(')').expect("CREATE TABLE )");
    let name = statement[..open]
        .split_whitespace()
        .last()
        .expect("table name")
        .to_owned();
    let columns = top_level_parts(&statement[open + 1..close])
        .into_iter()
        .filter(|part| {
            let first = part.split_whitespace().next().unwrap_or("");
            ![
                "CONSTRAINT",
                "PRIMARY",
                "UNIQUE",
                "CHECK",
                "FOREIGN",
                "EXCLUDE",
            ]
            .contains(&first.to_ascii_uppercase().as_str())
        })
        .map(|part| {
            (
                part.split_whitespace().next().expect("column").to_owned(),
                pg_nullable(part),
            )
        })
        .collect();
    (name, columns)
}

/// A column definition is nullable unless it says `NOT NULL`, is the
/// primary key or an identity column.
fn pg_nullable(definition: &str) -> bool {
    let upper = definition.to_ascii_uppercase();
    !(upper.contains("NOT NULL") || upper.contains("PRIMARY KEY") || upper.contains("IDENTITY"))
}

fn pg_alter_table(schema: &mut Schema, statement: &str, file: &Path) {
    let words: Vec<&str> = statement.split_whitespace().collect();
    let name = words[2].to_owned();
    let (_, actions) = statement
        .split_once(name.as_str())
        .expect("ALTER TABLE actions");
    for action in top_level_parts(actions) {
        let words: Vec<&str> = action.split_whitespace().collect();
        let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
        let upper: Vec<&str> = upper.iter().map(String::as_str).collect();
        let columns = schema.get_mut(&name).unwrap_or_else(|| {
            panic!("{}: ALTER TABLE of an unknown table {name}", file.display())
        });
        let find = |columns: &mut Vec<(String, bool)>, column: &str| {
            columns
                .iter()
                .position(|(c, _)| c == column)
                .unwrap_or_else(|| panic!("{}: no column {name}.{column}", file.display()))
        };
        match upper.as_slice() {
            ["ADD", "COLUMN", ..] => {
                let definition = action
                    .splitn(3, char::is_whitespace)
                    .nth(2)
                    .expect("column");
                let definition = definition
                    .trim_start()
                    .strip_prefix("IF NOT EXISTS")
                    .unwrap_or(definition)
                    .trim();
                let column = definition.split_whitespace().next().expect("column");
                columns.push((column.to_owned(), pg_nullable(definition)));
            }
            ["DROP", "COLUMN", ..] => {
                let at = find(columns, words[words.len() - 1]);
                columns.remove(at);
            }
            ["ALTER", "COLUMN", _, "SET", "NOT", "NULL"] => {
                let at = find(columns, words[2]);
                columns[at].1 = false;
            }
            ["ALTER", "COLUMN", _, "DROP", "NOT", "NULL"] => {
                let at = find(columns, words[2]);
                columns[at].1 = true;
            }
            ["RENAME", "TO", new] => {
                let columns = schema.remove(&name).expect("renamed table");
                schema.insert((*new).to_lowercase(), columns);
                return;
            }
            _ => panic!("{}: cannot read {action:?}", file.display()),
        }
    }
}

/// Columns as a set: the migrations of a long-lived table append columns
/// where `table!` may list them elsewhere.
fn unordered(schema: Schema) -> BTreeMap<String, BTreeMap<String, bool>> {
    schema
        .into_iter()
        .map(|(table, columns)| (table, columns.into_iter().collect()))
        .collect()
}

#[test]
fn the_sqlite_and_postgresql_table_definitions_have_the_same_columns_and_nullability() {
    assert_eq!(unordered(sqlite_module()), unordered(pg_module()));
}

#[test]
fn the_sqlite_migrations_give_the_tables_the_sqlite_schema_module_defines() {
    assert_eq!(unordered(sqlite_migrated()), unordered(sqlite_module()));
}

#[test]
fn the_postgresql_migrations_give_the_tables_the_postgresql_schema_module_defines() {
    assert_eq!(unordered(pg_migrated()), unordered(pg_module()));
}

#[test]
fn the_sqlite_and_postgresql_migrations_are_the_same_list_of_folders() {
    let names = |folder: &str| -> Vec<String> {
        migration_files(Path::new(folder))
            .iter()
            .map(|up| {
                let dir = up.parent().expect("folder");
                dir.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    assert_eq!(names("migrations/sqlite"), names("migrations/postgres"));
}
