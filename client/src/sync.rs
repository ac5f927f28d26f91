//! The one place the connection's locks, atomics and wakeups come from.
//!
//! Normally these are `parking_lot`'s mutex (no poisoning, small, fast
//! uncontended), `std`'s atomics and tokio's `Notify`: exactly what the
//! connection used before this shim, so the normal build is unchanged.
//! Under `--cfg tollgate_loom` (scripts/loom.sh) the same names resolve to
//! loom's types, so the models in `connection/loom_models.rs` drive the real
//! call path. The cfg is crate-specific on purpose: it must not flip tokio's
//! own `cfg(loom)`. Both sides expose the same API: `Mutex::new`, `lock()`
//! returning a guard; `Notify::notify_one` and `notified()`.

#[cfg(not(tollgate_loom))]
pub(crate) use parking_lot::Mutex;
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(tollgate_loom))]
pub(crate) use tokio::sync::Notify;

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};

#[cfg(tollgate_loom)]
pub(crate) use self::loom_types::{Mutex, Notify};

#[cfg(tollgate_loom)]
mod loom_types {
    /// loom's mutex behind parking_lot's API (no poisoning).
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            // A panic while holding the lock already fails the model;
            // poisoning carries no extra information here.
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// tokio's `Notify` plus a loom-visible permit.
    ///
    /// The tasks still await tokio's half (the async loops compile as
    /// usual); a model's thread blocks on the loom half with
    /// [`wait`](Self::wait), so a wakeup that is never sent shows up as a
    /// loom deadlock instead of a model that passes by spinning.
    #[derive(Debug)]
    pub(crate) struct Notify {
        tokio: tokio::sync::Notify,
        permit: loom::sync::Mutex<bool>,
        signal: loom::sync::Condvar,
    }

    impl Notify {
        pub(crate) fn new() -> Self {
            Self {
                tokio: tokio::sync::Notify::new(),
                permit: loom::sync::Mutex::new(false),
                signal: loom::sync::Condvar::new(),
            }
        }

        /// Stores one permit (as tokio's does when nobody waits) and wakes
        /// a waiter.
        pub(crate) fn notify_one(&self) {
            self.tokio.notify_one();
            *self.permit.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.signal.notify_one();
        }

        pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
            self.tokio.notified()
        }

        /// Blocks the model thread until a permit is stored, and takes it.
        #[cfg(test)]
        pub(crate) fn wait(&self) {
            let mut permit = self.permit.lock().unwrap_or_else(|e| e.into_inner());
            while !*permit {
                permit = self.signal.wait(permit).unwrap_or_else(|e| e.into_inner());
            }
            *permit = false;
        }
    }
}
