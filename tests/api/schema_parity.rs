//! The two backends' schemas stay equivalent: the same tables, the same
//! columns, the same nullability, in the migrations and in both modules of
//! `src/db/schema.rs`, and the ledger's table as the ledger crate's DDL
//! makes it. Needs no PostgreSQL server: the SQLite migrations are applied
//! to a temporary file and read back (`PRAGMA table_info`); the PostgreSQL
//! migrations are read as text (the `CREATE TABLE`, `CREATE INDEX` and
//! `ALTER TABLE` forms they use); the `table!` definitions are read through
//! diesel (the columns of `all_columns`, their SQL types).
//!
//! The keys (primary keys, unique and plain indexes) are compared as each
//! database reports them, so the PostgreSQL side needs a server
//! (`TEST_DATABASE_URL`): both backends leave the same keys, every key of
//! `orders` and of the ledger includes `user_id` (a table distributed by
//! `user_id` can enforce each on one shard), and the ledger crate's DDL
//! makes the ledger's table the migrations make.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::query_builder::QueryFragment;
use diesel::sql_types::{Integer, Text};
use diesel::{Table, debug_query};
use idempotency_ledger::schema as ledger;
use orders_api::db::schema::{pg, sqlite};
use orders_api::db::{DatabaseUrl, run_migrations};

use crate::helpers::TestDb;

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

/// A temporary SQLite file, removed when dropped.
struct SqliteFile(PathBuf);

impl SqliteFile {
    fn new() -> Self {
        Self(std::env::temp_dir().join(format!("schema-parity-{}.db", uuid::Uuid::new_v4())))
    }

    fn url(&self) -> DatabaseUrl {
        DatabaseUrl::parse(&format!("sqlite://{}", self.0.display())).expect("url")
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

/// Every table the SQLite migrations leave, as SQLite itself describes it.
fn sqlite_migrated() -> Schema {
    let file = SqliteFile::new();
    run_migrations(&file.url()).expect("apply the SQLite migrations");
    let mut conn = SqliteConnection::establish(file.url().as_str()).expect("open");
    sqlite_tables(&mut conn)
}

/// Every table of a SQLite database, as SQLite itself describes it.
fn sqlite_tables(conn: &mut SqliteConnection) -> Schema {
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

    let tables: Vec<TableName> = diesel::sql_query(
        "SELECT name FROM sqlite_master WHERE type = 'table' \
         AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '__diesel%' ORDER BY name",
    )
    .load(conn)
    .expect("tables");
    tables
        .into_iter()
        .map(|table| {
            let columns: Vec<ColumnInfo> =
                diesel::sql_query(format!("PRAGMA table_info(\"{}\")", table.name))
                    .load(conn)
                    .expect("columns");
            let columns = columns
                .into_iter()
                // An INTEGER PRIMARY KEY is the rowid: never NULL.
                .map(|c| (c.name, c.notnull == 0 && c.pk == 0))
                .collect();
            (table.name, columns)
        })
        .collect()
}

/// The PostgreSQL migrations, read as text in the order diesel applies them:
/// `CREATE TABLE`, `DROP TABLE`, `CREATE [UNIQUE] INDEX`, `DROP INDEX`, and
/// `ALTER TABLE` with `ADD COLUMN`, `DROP COLUMN`, `ALTER COLUMN … SET/DROP
/// NOT NULL`, `RENAME TO`, `DROP CONSTRAINT` and `ADD CONSTRAINT … PRIMARY
/// KEY / UNIQUE USING INDEX`. A statement on a table in any other form fails
/// the test, so that it is taught the form rather than ignoring it.
fn pg_migrated() -> Schema {
    let mut schema = Schema::new();
    // Index name → its columns, for a constraint made from an index.
    let mut indexes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for up in migration_files(Path::new("migrations/postgres")) {
        let text = without_comments(&std::fs::read_to_string(&up).expect("read migration"));
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
                ["CREATE", "INDEX", ..] | ["CREATE", "UNIQUE", "INDEX", ..] => {
                    let (name, columns) = pg_create_index(statement);
                    indexes.insert(name, columns);
                }
                ["DROP", "INDEX", ..] => {
                    indexes.remove(words[words.len() - 1]);
                }
                ["ALTER", "TABLE", ..] => pg_alter_table(&mut schema, &indexes, statement, &up),
                ["CREATE", ..] | ["DELETE", ..] | ["UPDATE", ..] | ["INSERT", ..] | [] => {}
                _ => panic!("{}: cannot read {statement:?}", up.display()),
            }
        }
    }
    schema
}

/// SQL text without its `--` comments.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
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

/// `CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] name ON table
/// (columns)`: the index's name and its columns (the first word of each
/// part: a sort order is dropped).
fn pg_create_index(statement: &str) -> (String, Vec<String>) {
    let open = statement.find('(').expect("CREATE INDEX (");
    let close = statement.rfind(')').expect("CREATE INDEX )");
    let head: Vec<&str> = statement[..open].split_whitespace().collect();
    let on = head
        .iter()
        .position(|w| w.eq_ignore_ascii_case("ON"))
        .expect("CREATE INDEX … ON");
    let columns = top_level_parts(&statement[open + 1..close])
        .into_iter()
        .map(|part| part.split_whitespace().next().expect("column").to_owned())
        .collect();
    (head[on - 1].to_owned(), columns)
}

/// A column definition is nullable unless it says `NOT NULL`, is the
/// primary key or an identity column.
fn pg_nullable(definition: &str) -> bool {
    let upper = definition.to_ascii_uppercase();
    !(upper.contains("NOT NULL") || upper.contains("PRIMARY KEY") || upper.contains("IDENTITY"))
}

fn pg_alter_table(
    schema: &mut Schema,
    indexes: &BTreeMap<String, Vec<String>>,
    statement: &str,
    file: &Path,
) {
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
            // Constraints change no column; a primary key makes its
            // columns NOT NULL.
            ["DROP", "CONSTRAINT", _] | ["ADD", "CONSTRAINT", _, "UNIQUE", "USING", "INDEX", _] => {
            }
            [
                "ADD",
                "CONSTRAINT",
                _,
                "PRIMARY",
                "KEY",
                "USING",
                "INDEX",
                _,
            ] => {
                let index = &indexes[words[words.len() - 1]];
                for column in index {
                    let at = find(columns, column);
                    columns[at].1 = false;
                }
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

/// A key or index: its columns in order, and whether it is unique.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    unique: bool,
    columns: Vec<String>,
}

/// Table → its keys and indexes, and its primary key's columns.
#[derive(Debug, Default, PartialEq, Eq)]
struct Keys {
    keys: BTreeMap<String, std::collections::BTreeSet<Key>>,
    primary: BTreeMap<String, Vec<String>>,
}

fn key(unique: bool, columns: &[&str]) -> Key {
    Key {
        unique,
        columns: columns.iter().map(|c| (*c).to_owned()).collect(),
    }
}

/// The keys of every table of a SQLite database, as SQLite reports them: its
/// indexes (unique constraints, primary keys that are not the rowid, and
/// `CREATE INDEX`), and a rowid alias (`INTEGER PRIMARY KEY`) as the unique
/// key it is.
fn sqlite_keys(conn: &mut SqliteConnection) -> Keys {
    #[derive(QueryableByName)]
    struct Index {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Integer)]
        unique: i32,
        #[diesel(sql_type = Text)]
        origin: String,
    }
    #[derive(QueryableByName)]
    struct IndexColumn {
        #[diesel(sql_type = Text)]
        name: String,
    }
    #[derive(QueryableByName)]
    struct Column {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Text)]
        #[diesel(column_name = "type")]
        type_: String,
        #[diesel(sql_type = Integer)]
        pk: i32,
    }
    let mut keys = Keys::default();
    for table in sqlite_tables(conn).into_keys() {
        let indexes: Vec<Index> = diesel::sql_query(format!("PRAGMA index_list(\"{table}\")"))
            .load(conn)
            .expect("indexes");
        let mut found = std::collections::BTreeSet::new();
        let mut primary_index = None;
        for index in &indexes {
            let columns: Vec<IndexColumn> =
                diesel::sql_query(format!("PRAGMA index_info(\"{}\")", index.name))
                    .load(conn)
                    .expect("index columns");
            let columns: Vec<String> = columns.into_iter().map(|c| c.name).collect();
            if index.origin == "pk" {
                primary_index = Some(columns.clone());
            }
            found.insert(Key {
                unique: index.unique == 1,
                columns,
            });
        }
        let columns: Vec<Column> = diesel::sql_query(format!("PRAGMA table_info(\"{table}\")"))
            .load(conn)
            .expect("columns");
        let mut pk: Vec<&Column> = columns.iter().filter(|c| c.pk > 0).collect();
        pk.sort_by_key(|c| c.pk);
        let pk: Vec<String> = pk.iter().map(|c| c.name.clone()).collect();
        let rowid_alias = primary_index.is_none()
            && pk.len() == 1
            && columns
                .iter()
                .any(|c| c.name == pk[0] && c.type_.eq_ignore_ascii_case("INTEGER"));
        if rowid_alias {
            found.insert(Key {
                unique: true,
                columns: pk.clone(),
            });
        }
        if !pk.is_empty() {
            keys.primary.insert(table.clone(), pk);
        }
        keys.keys.insert(table, found);
    }
    keys
}

/// The keys of the tables of a PostgreSQL database, as its catalog reports
/// them (every index: primary keys and unique constraints have one).
fn pg_keys(url: &DatabaseUrl, tables: &[&str]) -> Keys {
    #[derive(QueryableByName)]
    struct Index {
        #[diesel(sql_type = Text)]
        table_name: String,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        is_unique: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        is_primary: bool,
        #[diesel(sql_type = Text)]
        columns: String,
    }
    let mut conn = PgConnection::establish(url.as_str()).expect("connect");
    let indexes: Vec<Index> = diesel::sql_query(
        "SELECT t.relname::text AS table_name, i.indisunique AS is_unique, \
                i.indisprimary AS is_primary, \
                array_to_string(ARRAY( \
                    SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) \
                    JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum \
                    ORDER BY k.n), ',') AS columns \
         FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid \
         JOIN pg_namespace s ON s.oid = t.relnamespace \
         WHERE s.nspname = current_schema() AND t.relname = ANY($1)",
    )
    .bind::<diesel::sql_types::Array<Text>, _>(tables)
    .load(&mut conn)
    .expect("indexes");
    let mut keys = Keys::default();
    for table in tables {
        keys.keys.insert((*table).to_owned(), Default::default());
    }
    for index in indexes {
        let columns: Vec<String> = index.columns.split(',').map(str::to_owned).collect();
        if index.is_primary {
            keys.primary
                .insert(index.table_name.clone(), columns.clone());
        }
        keys.keys.entry(index.table_name).or_default().insert(Key {
            unique: index.is_unique,
            columns,
        });
    }
    keys
}

const TABLES: [&str; 3] = ["api_keys", "idempotency_ledger", "orders"];

/// A fresh PostgreSQL database with every migration applied.
fn pg_migrated_db() -> TestDb {
    let db = TestDb::fresh(orders_api::db::Backend::Postgres);
    run_migrations(&db.url).expect("apply the PostgreSQL migrations");
    db
}

crate::postgres_only! {
    fn on_postgresql_every_primary_key_and_unique_index_of_orders_and_the_ledger_includes_user_id() {
        let db = pg_migrated_db();
        let keys = pg_keys(&db.url, &TABLES);

        for table in ["orders", "idempotency_ledger"] {
            for key in &keys.keys[table] {
                assert!(
                    !key.unique || key.columns.iter().any(|c| c == "user_id"),
                    "{table}: a unique key without user_id cannot be enforced on one shard: {key:?}"
                );
            }
        }
        assert_eq!(keys.primary["orders"], ["user_id", "seq"]);
        assert_eq!(
            keys.primary["idempotency_ledger"],
            ["idempotency_key", "user_id"]
        );
        // A lookup by id names its user: an index that starts with user_id serves it.
        assert!(
            keys.keys["orders"].contains(&key(true, &["user_id", "id"])),
            "{keys:?}"
        );
        assert!(
            keys.keys["orders"].contains(&key(true, &["user_id", "idempotency_key"])),
            "the second guard: {keys:?}"
        );
    }
}

crate::postgres_only! {
    fn the_sqlite_and_postgresql_migrations_leave_the_same_keys_and_indexes() {
        let db = pg_migrated_db();
        let pg = pg_keys(&db.url, &TABLES);
        let file = SqliteFile::new();
        run_migrations(&file.url()).expect("apply the SQLite migrations");
        let mut conn = SqliteConnection::establish(file.url().as_str()).expect("open");
        let mut sqlite = sqlite_keys(&mut conn);

        // The one difference, SQLite's own: `orders.seq` is its rowid
        // (INTEGER PRIMARY KEY AUTOINCREMENT), which numbers the orders in
        // creation order, never reusing a number; that makes it a key of its
        // own, and the table's primary key. PostgreSQL's identity column needs
        // neither, and its primary key is (user_id, seq).
        let sqlite_orders = sqlite.keys.get_mut("orders").expect("orders");
        assert!(sqlite_orders.remove(&key(true, &["seq"])), "{sqlite:?}");
        assert_eq!(
            sqlite.primary.remove("orders").as_deref(),
            Some(&["seq".to_owned()][..])
        );
        assert_eq!(
            pg.primary.get("orders").map(Vec::as_slice),
            Some(&["user_id".to_owned(), "seq".to_owned()][..])
        );
        let mut pg = pg;
        pg.primary.remove("orders");
        assert_eq!(sqlite, pg);
    }
}

#[test]
fn the_ledger_crates_sqlite_ddl_makes_the_table_the_sqlite_migrations_make() {
    let file = SqliteFile::new();
    let mut conn = SqliteConnection::establish(file.url().as_str()).expect("open");
    conn.batch_execute(idempotency_ledger::SQLITE_DDL)
        .expect("the ledger crate's DDL");
    let from_ddl = (sqlite_tables(&mut conn), sqlite_keys(&mut conn));

    let migrated = SqliteFile::new();
    run_migrations(&migrated.url()).expect("apply the SQLite migrations");
    let mut conn = SqliteConnection::establish(migrated.url().as_str()).expect("open");
    let (mut tables, mut keys) = (sqlite_tables(&mut conn), sqlite_keys(&mut conn));
    let ledger = |tables: &mut Schema, keys: &mut Keys| {
        (
            tables.remove("idempotency_ledger"),
            keys.keys.remove("idempotency_ledger"),
            keys.primary.remove("idempotency_ledger"),
        )
    };
    let (mut ddl_tables, mut ddl_keys) = from_ddl;
    assert_eq!(
        ledger(&mut ddl_tables, &mut ddl_keys),
        ledger(&mut tables, &mut keys)
    );
    assert!(
        ddl_tables.is_empty(),
        "the DDL makes the ledger's table only"
    );
}

crate::postgres_only! {
    fn the_ledger_crates_postgresql_ddl_makes_the_table_the_postgresql_migrations_make() {
        let ddl = without_comments(idempotency_ledger::POSTGRES_DDL);
        let (name, columns) = pg_create_table(
            ddl.split(';')
                .find(|s| s.contains("CREATE TABLE"))
                .expect("CREATE TABLE"),
        );
        assert_eq!(
            unordered([(name, columns)].into_iter().collect()).get("idempotency_ledger"),
            unordered(pg_migrated()).get("idempotency_ledger"),
            "columns and nullability"
        );

        let from_ddl = TestDb::fresh(orders_api::db::Backend::Postgres);
        let mut conn = PgConnection::establish(from_ddl.url.as_str()).expect("connect");
        conn.batch_execute(idempotency_ledger::POSTGRES_DDL)
            .expect("the ledger crate's DDL");
        let migrated = pg_migrated_db();
        assert_eq!(
            pg_keys(&from_ddl.url, &["idempotency_ledger"]),
            pg_keys(&migrated.url, &["idempotency_ledger"])
        );
    }
}
