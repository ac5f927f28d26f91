//! What a one-pair check routed in cluster mode keeps so that it can be
//! sent again (after MOVED, TryAgain, NotPrimary or a lost CHECK2):
//! its key and its CHECK2 tag. Its limit and cost stay where they already
//! are, in the check's own pair ([`Single`](super::single::Single) keeps
//! them to describe the answer), and the checks are built again from the
//! two only when a resend happens.
//!
//! Why not a clone of the checks: the key is a `Bytes`, and cloning it is
//! an atomic increment through its vtable now and an atomic decrement when
//! the copy is dropped, for every check, while the copy is used only by
//! the few answers that are not decisions. That, with the clone of the
//! checks around it, was about a third of what cluster mode added to a
//! check's client CPU (issue 25). A short key's bytes are copied instead
//! (a small `memcpy` into the check's own state, nothing shared touched);
//! a longer key is still shared.
//!
//! Invariant: [`checks`] over what [`KeptKey::take`] gives back is exactly
//! the checks that were sent (same key bytes, limit, cost and tag), so a
//! resend is the same request, and a CHECK2 keeps its idempotency key.

use bytes::Bytes;
use tollgate_protocol::{CheckTag, Pair};

use crate::connection::pending::Checks;

/// Keys up to this long are kept by value. Most rate-limit keys
/// (`rl:{tenant}:route`) fit; the size keeps [`KeptKey`] at 40 bytes.
const INLINE: usize = 38;

/// A copy of a check's key, by value when short. It lives in the check's
/// future and is written there in place ([`keep`](Self::keep)): built
/// aside and moved in, the copy's bytes were read back right after the
/// copy wrote them, in wider pieces than it wrote, and the processor
/// stalled on that (a failed store forwarding, per check).
pub(super) enum KeptKey {
    /// Nothing kept (not a cluster check, or already taken).
    None,
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Shared(Bytes),
}

impl KeptKey {
    /// Keeps a copy of `key`, in place.
    pub(super) fn keep(&mut self, key: &Bytes) {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE => {
                *self = Self::Inline {
                    len,
                    bytes: [0; INLINE],
                };
                if let Self::Inline { bytes, .. } = self {
                    bytes[..key.len()].copy_from_slice(key);
                }
            }
            _ => *self = Self::Shared(key.clone()),
        }
    }

    /// The key kept, as sent (a new buffer for a short key: only a resend
    /// pays for it); `None` when nothing is kept.
    pub(super) fn take(&mut self) -> Option<Bytes> {
        match std::mem::replace(self, Self::None) {
            Self::None => None,
            Self::Inline { len, bytes } => Some(Bytes::copy_from_slice(&bytes[..usize::from(len)])),
            Self::Shared(key) => Some(key),
        }
    }
}

/// The checks of a one-pair check as they were sent: its key `key`, its
/// CHECK2 tag if any, and `pair`'s limit and cost (`pair`'s key is not
/// read: it may have gone with the call).
pub(super) fn checks(key: Bytes, tag: Option<CheckTag>, pair: &Pair) -> Checks {
    let pair = Pair {
        key,
        limit: pair.limit.clone(),
        cost: pair.cost,
    };
    match tag {
        Some(tag) => Checks::Tagged(tag, vec![pair]),
        None => Checks::One(pair),
    }
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::units::Rate;
    use tollgate_protocol::{IdempotencyKey, Limit, LimitRef, Priority};

    use super::*;

    fn limit() -> LimitRef {
        Limit::token_bucket(Rate::per_second(5), 10).into()
    }

    /// Keys on both sides of the inline size, the empty key and a key too
    /// long for a `u8` length all come back as they went, once.
    #[test]
    fn kept_keys_come_back_byte_for_byte_once() {
        let mut kept = KeptKey::None;
        assert_eq!(kept.take(), None);
        for len in [0, 1, 17, INLINE - 1, INLINE, INLINE + 1, 255, 256, 1000, 3] {
            let key = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>());
            // Over whatever was kept before (a longer key, a shared one).
            kept.keep(&key);
            assert_eq!(
                matches!(kept, KeptKey::Inline { .. }),
                len <= INLINE,
                "len {len}"
            );
            assert_eq!(kept.take(), Some(key), "len {len}");
            assert_eq!(kept.take(), None, "len {len}");
        }
    }

    /// The checks rebuilt for a resend are the checks sent: plain, and
    /// CHECK2 with the same idempotency key and priority; the key comes
    /// from what was kept, not from the pair (whose key went with the call).
    #[test]
    fn a_resend_is_the_request_that_was_sent() {
        let sent = Pair {
            key: Bytes::from_static(b"rl:{acme}:second"),
            limit: limit(),
            cost: 3,
        };
        let kept_pair = Pair {
            key: Bytes::new(),
            ..sent.clone()
        };
        let mut kept = KeptKey::None;
        kept.keep(&sent.key);
        let again = checks(kept.take().expect("kept"), None, &kept_pair);
        assert!(matches!(&again, Checks::One(p) if *p == sent), "{again:?}");

        let tag = CheckTag::new(IdempotencyKey::from_u128(42), Priority::High);
        let long = Pair {
            key: Bytes::from(vec![b'k'; 300]),
            ..sent.clone()
        };
        kept.keep(&long.key);
        let again = checks(kept.take().expect("kept"), Some(tag), &kept_pair);
        assert!(
            matches!(&again, Checks::Tagged(t, pairs) if *t == tag && pairs[..] == [long.clone()]),
            "{again:?}"
        );
    }
}
