//! The one place locks and atomics come from.
//!
//! Production uses `parking_lot` (no poisoning, small, fast uncontended) and
//! `std` atomics. Under `--cfg tollgate_loom` the same names resolve to loom's
//! types so the loom models in `loom-tests/` drive the real store code. The
//! cfg is crate-specific on purpose: it must not flip tokio's own `cfg(loom)`.
//! Both sides expose the same API: `Mutex::new`, `lock()` returning a guard,
//! `try_lock()` returning one when free.

#[cfg(not(tollgate_loom))]
pub use parking_lot::{Mutex, MutexGuard};
#[cfg(not(tollgate_loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(tollgate_loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(tollgate_loom)]
pub use self::loom_mutex::{Mutex, MutexGuard};

#[cfg(tollgate_loom)]
mod loom_mutex {
    /// loom's mutex behind parking_lot's API (no poisoning).
    #[derive(Debug)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            // A panic while holding the lock already fails the model;
            // poisoning carries no extra information here.
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
    }
}
