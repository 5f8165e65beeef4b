//! Channels between a pipeline's stages, bounded by bytes as well as by
//! count.
//!
//! A channel of four batches is right for batches of 10,000 rows and wrong
//! for transactions of one row: the producer then waits for the consumer
//! after every fourth, and each wait is a thread wake-up that costs more
//! than the transaction. These channels hold up to `count` items whose
//! declared sizes add up to at most `bytes`, so many small batches queue up
//! while a stage is busy (and are then taken in one go) and a few large ones
//! bound the memory as before. An item larger than the whole budget waits
//! for all of it.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// A channel of at most `count` items and `bytes` declared bytes.
pub fn channel<T>(count: usize, bytes: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel(count.max(1));
    let total = bytes.clamp(1, u32::MAX as usize) as u32;
    (
        Sender {
            tx,
            budget: Arc::new(Semaphore::new(total as usize)),
            total,
        },
        Receiver { rx },
    )
}

/// The sending half.
#[derive(Debug)]
pub struct Sender<T> {
    tx: mpsc::Sender<(T, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    total: u32,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            tx: self.tx.clone(),
            budget: self.budget.clone(),
            total: self.total,
        }
    }
}

/// The receiving half was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// Room for one item of a given size, reserved.
#[derive(Debug)]
pub struct Permit<'a, T> {
    slot: mpsc::Permit<'a, (T, OwnedSemaphorePermit)>,
    bytes: OwnedSemaphorePermit,
}

impl<T> Permit<'_, T> {
    /// Sends the item the room was reserved for.
    pub fn send(self, item: T) {
        self.slot.send((item, self.bytes));
    }
}

impl<T> Sender<T> {
    /// Waits for room for an item of `bytes` (bytes first, then a slot).
    /// Cancel-safe: dropping the future gives back what it had reserved.
    pub async fn reserve(&self, bytes: usize) -> Result<Permit<'_, T>, Closed> {
        let wanted = (bytes.max(1).min(self.total as usize)) as u32;
        let bytes = self
            .budget
            .clone()
            .acquire_many_owned(wanted)
            .await
            .map_err(|_| Closed)?;
        let slot = self.tx.reserve().await.map_err(|_| Closed)?;
        Ok(Permit { slot, bytes })
    }

    /// Whether nothing sent is still waiting to be received.
    pub fn is_empty(&self) -> bool {
        self.budget.available_permits() == self.total as usize
    }

    /// Completes once nothing sent is waiting to be received (at once if
    /// so already). Cancel-safe, like `reserve`.
    pub async fn emptied(&self) {
        if let Ok(all) = self.budget.acquire_many(self.total).await {
            drop(all);
        }
    }

    /// Sends `item`, declared as `bytes`, once there is room.
    pub async fn send(&self, item: T, bytes: usize) -> Result<(), T> {
        match self.reserve(bytes).await {
            Ok(permit) => {
                permit.send(item);
                Ok(())
            }
            Err(Closed) => Err(item),
        }
    }
}

/// The receiving half. An item's bytes go back to the budget when it is
/// received.
#[derive(Debug)]
pub struct Receiver<T> {
    rx: mpsc::Receiver<(T, OwnedSemaphorePermit)>,
}

impl<T> Receiver<T> {
    /// The next item; `None` once every sender is gone and the channel is
    /// empty.
    pub async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await.map(|(item, _bytes)| item)
    }

    /// The next item if one is waiting.
    pub fn try_recv(&mut self) -> Option<T> {
        self.rx.try_recv().ok().map(|(item, _bytes)| item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn many_small_items_fit_where_few_large_ones_do() {
        let (tx, mut rx) = channel::<u32>(100, 10_000);
        for i in 0..100 {
            tx.send(i, 10).await.expect("room for 100 × 10 bytes");
        }
        // Full by count.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), tx.send(100, 1))
                .await
                .is_err()
        );
        for i in 0..100 {
            assert_eq!(rx.try_recv(), Some(i));
        }
        assert_eq!(rx.try_recv(), None);
        let (tx, mut rx) = channel::<u32>(100, 1000);
        // Full by bytes: two of 400 fit, a third waits for a receive.
        tx.send(1, 400).await.expect("room");
        tx.send(2, 400).await.expect("room");
        let third = tokio::time::timeout(Duration::from_millis(50), tx.send(3, 400)).await;
        assert!(third.is_err(), "800 + 400 bytes must not fit in 1000");
        assert_eq!(rx.recv().await, Some(1));
        tx.send(3, 400).await.expect("room again");
        // Larger than the whole budget: waits for all of it.
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(3));
        tx.send(4, 5000).await.expect("the whole budget");
        assert_eq!(rx.recv().await, Some(4));
        drop(tx);
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn emptied_waits_until_everything_sent_was_received() {
        let (tx, mut rx) = channel::<u32>(10, 1000);
        assert!(tx.is_empty());
        tokio::time::timeout(Duration::from_millis(50), tx.emptied())
            .await
            .expect("empty at once");
        tx.send(1, 300).await.expect("room");
        tx.send(2, 1).await.expect("room");
        assert!(!tx.is_empty());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), tx.emptied())
                .await
                .is_err(),
            "two items wait"
        );
        assert_eq!(rx.recv().await, Some(1));
        assert!(!tx.is_empty());
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.emptied().await }
        });
        assert_eq!(rx.recv().await, Some(2));
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("emptied once the last item was received")
            .expect("joined");
        assert!(tx.is_empty());
        // Waiting gave back what it had taken: the whole budget is there.
        tx.send(3, 1000).await.expect("the whole budget");
    }

    #[tokio::test]
    async fn a_closed_receiver_gives_the_item_back() {
        let (tx, rx) = channel::<&str>(4, 100);
        drop(rx);
        assert_eq!(tx.send("x", 1).await, Err("x"));
    }
}
