//! PostgreSQL only: `pgbench` inserting one row per transaction, the
//! server's own ceiling.

use std::process::Command;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

use super::Config;

/// PostgreSQL's own one-row-per-transaction insert rate into a table shaped
/// like `orders`, with the same number of clients.
pub(crate) fn pgbench(config: &Config, url: &str) -> f64 {
    let mut conn = PgConnection::establish(url).expect("connect for pgbench");
    conn.batch_execute(
        // INCLUDING ALL copies the identity of `seq` with a sequence of its own.
        "CREATE TABLE IF NOT EXISTS pgbench_orders (LIKE orders INCLUDING ALL);",
    )
    .expect("pgbench table");
    let script = config.dir.join("pgbench.sql");
    std::fs::write(
        &script,
        "INSERT INTO pgbench_orders (id, user_id, item, quantity, price_cents, status, \
         idempotency_key, request_fingerprint, created_at, updated_at) VALUES \
         (gen_random_uuid(), 'bench', 'Widget', 2, 999, 'pending', gen_random_uuid()::text, \
         'fp', now(), now());\n",
    )
    .expect("pgbench script");
    let plain_url = url.split('?').next().unwrap_or(url);
    let output = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-j", "2", "-c"])
        .arg(config.connections.to_string())
        .args(["-T", &config.seconds.to_string(), "-f"])
        .arg(&script)
        .arg(plain_url)
        .output()
        .expect("pgbench (apt-get install postgresql-client)");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
