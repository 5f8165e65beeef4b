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

/// An item in the channel: its bytes' share of the budget, and what it
/// holds until it is received.
type Entry<T> = (T, OwnedSemaphorePermit, Option<OwnedSemaphorePermit>);

/// The sending half.
#[derive(Debug)]
pub struct Sender<T> {
    tx: mpsc::Sender<Entry<T>>,
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
    slot: mpsc::Permit<'a, Entry<T>>,
    bytes: OwnedSemaphorePermit,
}

impl<T> Permit<'_, T> {
    /// Sends the item the room was reserved for.
    pub fn send(self, item: T) {
        self.slot.send((item, self.bytes, None));
    }

    /// Sends the item with `hold`, which is released when the item is
    /// received.
    pub fn send_holding(self, item: T, hold: OwnedSemaphorePermit) {
        self.slot.send((item, self.bytes, Some(hold)));
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
    rx: mpsc::Receiver<Entry<T>>,
}

impl<T> Receiver<T> {
    /// The next item; `None` once every sender is gone and the channel is
    /// empty.
    pub async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await.map(|(item, _bytes, _hold)| item)
    }

    /// The next item if one is waiting.
    pub fn try_recv(&mut self) -> Option<T> {
        self.rx.try_recv().ok().map(|(item, _bytes, _hold)| item)
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
    async fn what_an_item_holds_is_released_when_it_is_received() {
        let (tx, mut rx) = channel::<u32>(10, 1000);
        let parts = Arc::new(Semaphore::new(1));
        let hold = parts.clone().try_acquire_owned().expect("one permit");
        tx.reserve(1).await.expect("room").send_holding(1, hold);
        tx.send(2, 1).await.expect("room");
        assert!(
            parts.clone().try_acquire_owned().is_err(),
            "held while queued"
        );
        assert_eq!(rx.recv().await, Some(1));
        assert!(parts.try_acquire_owned().is_ok(), "released once received");
        assert_eq!(rx.recv().await, Some(2));
    }

    #[tokio::test]
    async fn a_closed_receiver_gives_the_item_back() {
        let (tx, rx) = channel::<&str>(4, 100);
        drop(rx);
        assert_eq!(tx.send("x", 1).await, Err("x"));
    }
}
