//! Counter keys from untrusted identifiers.
//!
//! A gateway limits by what callers send (an API key, an IP, a path), and a
//! key scheme like `rl:{<api key>}:search` is only as safe as the
//! identifier: `}` closes the hash tag early (the group's keys land in two
//! slots: CrossSlot), a 300-byte identifier makes the key too long, an
//! empty one shares a counter among everyone who sends nothing. Each of
//! those must be refused or neutralised, never let through.
//!
//! [`KeyBuilder`] makes any identifier safe:
//! - the identifier becomes the hash tag, percent-encoded: bytes outside
//!   `A-Z a-z 0-9 - . _ ~` (so `{`, `}`, `%`, `:` and every non-ASCII byte)
//!   are written `%XX`, so the tag can never contain a brace;
//! - an encoded tag longer than `max_tag_len` is replaced by `=` and the
//!   first 128 bits of its SHA-256 in hex (32 characters): bounded length,
//!   and no one can pick an identifier that collides with another's
//!   counter. `=` never appears in an encoded identifier, so the two forms
//!   cannot meet;
//! - an empty identifier is an error ([`KeyError::EmptyIdentifier`]): the
//!   caller decides (the tower layer answers 400);
//! - the result depends on the bytes only (no process-local seed), so every
//!   gateway of a fleet builds the same key for the same caller.
//!
//! Keys read `prefix:{tag}:suffix`; the prefix and suffix are the
//! application's own, checked once when the builder is made.

use std::fmt::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use sha2::{Digest, Sha256};
use tollgate_protocol::DEFAULT_MAX_KEY_LEN;

/// Default longest encoded tag before it is hashed.
pub const DEFAULT_MAX_TAG_LEN: usize = 64;
/// Bytes of SHA-256 kept in a hashed tag (128 bits).
const HASHED_BYTES: usize = 16;
/// Length of a hashed tag: the marker and 32 hex digits.
pub const HASHED_TAG_LEN: usize = 1 + 2 * HASHED_BYTES;

/// Why a key cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("empty identifier")]
    EmptyIdentifier,
    /// A prefix or suffix holding something other than `A-Z a-z 0-9 _ - . :`.
    #[error("{part} {value:?} may hold only A-Z a-z 0-9 _ - . : (no braces)")]
    BadPart { part: &'static str, value: String },
    #[error("key of {len} bytes exceeds the limit of {max}")]
    KeyTooLong { len: usize, max: usize },
    #[error("max_tag_len of {got} is below the hashed tag's {min} bytes")]
    TagLimitTooSmall { got: usize, min: usize },
}

/// Builds `prefix:{tag}:suffix` keys from untrusted identifiers (see the
/// module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyBuilder {
    prefix: String,
    max_tag_len: usize,
    max_key_len: usize,
}

impl KeyBuilder {
    /// A builder for keys starting with `prefix` (e.g. `rl`), with the
    /// default bounds: tags hashed past 64 bytes, keys at most the server's
    /// default `max_key_len` (256).
    pub fn new(prefix: &str) -> Result<Self, KeyError> {
        check_part("prefix", prefix)?;
        Ok(Self {
            prefix: prefix.to_owned(),
            max_tag_len: DEFAULT_MAX_TAG_LEN,
            max_key_len: usize::from(DEFAULT_MAX_KEY_LEN),
        })
    }

    /// Encoded tags longer than `max` bytes are hashed (at least
    /// [`HASHED_TAG_LEN`]).
    pub fn max_tag_len(mut self, max: usize) -> Result<Self, KeyError> {
        if max < HASHED_TAG_LEN {
            return Err(KeyError::TagLimitTooSmall {
                got: max,
                min: HASHED_TAG_LEN,
            });
        }
        self.max_tag_len = max;
        Ok(self)
    }

    /// Keys longer than `max` bytes are refused (the server's
    /// `max_key_len`, if it was set lower than the default).
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The hash tag for `identifier`: percent-encoded, or hashed when long.
    pub fn tag(&self, identifier: &[u8]) -> Result<String, KeyError> {
        if identifier.is_empty() {
            return Err(KeyError::EmptyIdentifier);
        }
        let mut tag = String::with_capacity(identifier.len().min(self.max_tag_len));
        for &b in identifier {
            if tag.len() > self.max_tag_len {
                break;
            }
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                tag.push(char::from(b));
            } else {
                // Writing into a String cannot fail.
                let _ = write!(tag, "%{b:02X}");
            }
        }
        if tag.len() > self.max_tag_len {
            let digest = Sha256::digest(identifier);
            tag.clear();
            tag.push('=');
            for b in &digest[..HASHED_BYTES] {
                let _ = write!(tag, "{b:02x}");
            }
        }
        Ok(tag)
    }

    /// The key `prefix:{tag}:suffix` for `identifier`. `suffix` names the
    /// counter (`search`, `login:per-day`); the same identifier with any
    /// suffix lands in the same slot, so its counters can form one atomic
    /// group.
    pub fn key(&self, identifier: &[u8], suffix: &str) -> Result<Bytes, KeyError> {
        check_part("suffix", suffix)?;
        let tag = self.tag(identifier)?;
        self.assemble(&tag, suffix)
    }

    /// The key of an already built tag (see [`tag`](Self::tag)).
    pub(crate) fn assemble(&self, tag: &str, suffix: &str) -> Result<Bytes, KeyError> {
        let len = self.prefix.len() + 2 + tag.len() + 2 + suffix.len();
        if len > self.max_key_len {
            return Err(KeyError::KeyTooLong {
                len,
                max: self.max_key_len,
            });
        }
        let mut key = BytesMut::with_capacity(len);
        key.put_slice(self.prefix.as_bytes());
        key.put_slice(b":{");
        key.put_slice(tag.as_bytes());
        key.put_slice(b"}:");
        key.put_slice(suffix.as_bytes());
        Ok(key.freeze())
    }
}

/// Checks an application-chosen part of a key (prefix, suffix, policy and
/// limit names).
pub(crate) fn check_part(part: &'static str, value: &str) -> Result<(), KeyError> {
    let ok = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(KeyError::BadPart {
            part,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The hash tag of a key as the server computes it (Redis Cluster
    /// rule): between the first `{` and the next `}`, when non-empty.
    fn hash_tag(key: &[u8]) -> Option<&[u8]> {
        let open = key.iter().position(|&b| b == b'{')?;
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    }

    #[test]
    fn braces_and_separators_are_escaped() {
        let keys = KeyBuilder::new("rl").unwrap();
        assert_eq!(
            &keys.key(b"acme-42", "search").unwrap()[..],
            b"rl:{acme-42}:search"
        );
        assert_eq!(&keys.key(b"}", "search").unwrap()[..], b"rl:{%7D}:search");
        assert_eq!(
            &keys.key(b"a{b}:c%", "s").unwrap()[..],
            b"rl:{a%7Bb%7D%3Ac%25}:s"
        );
        assert_eq!(keys.key(b"", "s"), Err(KeyError::EmptyIdentifier));
    }

    #[test]
    fn long_identifiers_are_hashed_to_a_bounded_stable_tag() {
        let keys = KeyBuilder::new("rl").unwrap();
        let long = vec![b'k'; 300];
        let a = keys.key(&long, "search").unwrap();
        assert_eq!(a.len(), "rl:{}:search".len() + HASHED_TAG_LEN);
        assert_eq!(a, keys.key(&long, "search").unwrap(), "stable");
        // The same identifier's counters share the tag, hence the slot.
        let b = keys.key(&long, "login").unwrap();
        assert_eq!(hash_tag(&a), hash_tag(&b));
        // A known digest, so every gateway (and every version) agrees.
        assert_eq!(
            keys.tag(&long).unwrap(),
            "=17b16d8ef494060fefa36a6a41567b8c"
        );
        let mut other = long.clone();
        other[299] = b'j';
        assert_ne!(keys.tag(&long).unwrap(), keys.tag(&other).unwrap());
    }

    #[test]
    fn bad_parts_and_limits_are_refused() {
        assert!(matches!(
            KeyBuilder::new("rl{"),
            Err(KeyError::BadPart { part: "prefix", .. })
        ));
        let keys = KeyBuilder::new("rl").unwrap();
        assert!(matches!(
            keys.key(b"a", "x}"),
            Err(KeyError::BadPart { part: "suffix", .. })
        ));
        let short = keys.clone().max_key_len(10);
        assert_eq!(
            short.key(b"abcdef", "search"),
            Err(KeyError::KeyTooLong { len: 18, max: 10 })
        );
        assert!(keys.max_tag_len(8).is_err());
    }

    proptest! {
        /// Whatever the identifier, the key has exactly one hash tag, it is
        /// the whole encoded identifier, and the key is within bounds.
        #[test]
        fn any_identifier_gives_one_well_formed_tag(id in proptest::collection::vec(any::<u8>(), 1..400)) {
            let keys = KeyBuilder::new("rl").unwrap();
            let key = keys.key(&id, "search").unwrap();
            prop_assert!(key.len() <= 256);
            let tag = hash_tag(&key).expect("a tag");
            let expected = keys.tag(&id).unwrap();
            prop_assert_eq!(tag, expected.as_bytes());
            prop_assert_eq!(key.iter().filter(|&&b| b == b'{').count(), 1);
            prop_assert_eq!(key.iter().filter(|&&b| b == b'}').count(), 1);
        }

        /// Distinct identifiers get distinct tags (escaping is injective,
        /// hashing collision-resistant).
        #[test]
        fn distinct_identifiers_get_distinct_tags(
            a in proptest::collection::vec(any::<u8>(), 1..100),
            b in proptest::collection::vec(any::<u8>(), 1..100),
        ) {
            prop_assume!(a != b);
            let keys = KeyBuilder::new("rl").unwrap();
            prop_assert_ne!(keys.tag(&a).unwrap(), keys.tag(&b).unwrap());
        }
    }
}
