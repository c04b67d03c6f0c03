//! The test targets' one accept loop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// A listener on a free port of 127.0.0.1 that hands each connection, on a
/// thread of its own, to its handler, until it is dropped. It blocks in
/// `accept`: dropping it wakes the loop with a connection of its own.
pub struct Front {
    /// `http://127.0.0.1:PORT`.
    pub address: String,
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Front {
    pub fn start(handle: impl Fn(TcpStream) + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test target");
        let local = listener.local_addr().expect("its address");
        let stop = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(handle);
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let handle = Arc::clone(&handle);
                    std::thread::spawn(move || handle(client));
                }
            })
        };
        Self {
            address: format!("http://{local}"),
            local,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.local);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
