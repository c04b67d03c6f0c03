//! PostgreSQL: how many of the pool's connections admitted writes hold at
//! once. Reads and writes share one pool, so the admitted writes hold at
//! most [`WriteConnections`] of it, one in [`READ_RESERVE`] fewer than its
//! size, and reads (replays among them) always find a connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The share of the pool (one in this many connections, at least one)
/// that admitted writes never hold, so reads always find one.
pub const READ_RESERVE: u32 = 4;

/// How many database connections admitted writes hold at once (an async
/// semaphore: a write waiting for one holds no thread).
#[derive(Debug, Clone)]
pub(crate) struct WriteConnections {
    permits: Arc<Semaphore>,
}

/// The right to hold one write connection; dropping it passes it on.
#[derive(Debug)]
pub struct WriteConnection {
    _permit: OwnedSemaphorePermit,
}

impl WriteConnections {
    /// For a pool of `pool_size`: all but its read reserve.
    pub(crate) fn for_pool(pool_size: u32) -> Self {
        let reserve = pool_size.div_ceil(READ_RESERVE).max(1);
        let limit = usize::try_from(pool_size.saturating_sub(reserve).max(1)).unwrap_or(1);
        Self {
            permits: Arc::new(Semaphore::new(limit)),
        }
    }

    /// How many write connections may be held at once (of a fresh one).
    #[cfg(test)]
    fn limit(&self) -> usize {
        self.permits.available_permits()
    }

    /// Waits at most `timeout` for the right to hold a connection; `None`
    /// when none came free (answered like a pool that has none: `503`).
    pub(crate) async fn acquire(&self, timeout: Duration) -> Option<WriteConnection> {
        let permit = tokio::time::timeout(timeout, Arc::clone(&self.permits).acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(WriteConnection { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_leave_a_quarter_of_the_pool_to_reads() {
        assert_eq!(WriteConnections::for_pool(10).limit(), 7);
        assert_eq!(WriteConnections::for_pool(8).limit(), 6);
        assert_eq!(WriteConnections::for_pool(1).limit(), 1);
        let connections = WriteConnections::for_pool(2);
        let held = connections.acquire(Duration::ZERO).await;
        assert!(held.is_some());
        assert!(
            connections
                .acquire(Duration::from_millis(1))
                .await
                .is_none()
        );
        drop(held);
        assert!(connections.acquire(Duration::ZERO).await.is_some());
    }
}
