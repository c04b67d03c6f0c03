//! The orders-api binary under test, as its own process on a free port.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orders_api::db::Backend;

use super::rss::peak_rss_kb;
use super::{Config, Target};

/// The orders-api binary serving on a free port, as its own process.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) base: String,
}

impl Server {
    pub(crate) fn start(config: &Config, target: &Target, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let mut command = Command::new(&config.bin);
        command
            .arg("serve")
            .env("DATABASE_URL", target.url())
            .env("BIND_ADDR", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if target.backend() == Backend::Postgres {
            // Enough connections that concurrent commits share PostgreSQL's WAL flushes.
            let per_process = (config.connections as usize / config.processes).max(4);
            command.env("DATABASE_POOL_SIZE", per_process.to_string());
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("start orders-api");
        let base = format!("http://127.0.0.1:{port}");
        wait_until_up(&format!("{base}/readyz"));
        Self { child, base }
    }

    pub(crate) fn peak_rss_kb(&self) -> u64 {
        peak_rss_kb(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub(crate) fn wait_until_up(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if ureq::get(url).call().is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}
