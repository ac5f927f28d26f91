//! The fields several payloads share: a key (key_len-prefixed: CHECK,
//! PEEK, REFUND, CHECK2, RESET, RELEASE, USAGE) and a rule name
//! (name_len-prefixed: a pair's rule, a USAGE entry's), each length
//! checked against its bound before the bytes are read.

use bytes::Bytes;

use super::frame::PayloadReader;
use super::DecodeError;
use crate::message::{RuleName, ServerLimits, MAX_RULE_NAME_LEN};

/// A name_len-prefixed rule name, its length checked before it is read
/// (copied when short, sliced when long: `RuleName`).
#[inline]
pub(super) fn decode_rule_name(r: &mut PayloadReader) -> Result<RuleName, DecodeError> {
    let len = r.u8()?;
    if len == 0 || usize::from(len) > MAX_RULE_NAME_LEN {
        return Err(DecodeError::RuleNameLength {
            request_id: r.request_id,
            len,
        });
    }
    let (request_id, len) = (r.request_id, usize::from(len));
    let name = if len > RuleName::INLINE_LEN {
        RuleName::new(r.bytes(len)?)
    } else {
        r.take_with(len, |window| RuleName::copied(window, len))?
    };
    name.map_err(|_| DecodeError::InvalidUtf8 {
        request_id,
        field: "rule name",
    })
}

/// A key_len-prefixed key, its length checked before it is sliced.
#[inline]
pub(super) fn decode_key(
    r: &mut PayloadReader,
    limits: &ServerLimits,
) -> Result<Bytes, DecodeError> {
    let len = r.u16()?;
    if len == 0 {
        return Err(DecodeError::EmptyKey {
            request_id: r.request_id,
        });
    }
    if len > limits.max_key_len {
        return Err(DecodeError::KeyTooLong {
            request_id: r.request_id,
            len,
            max: limits.max_key_len,
        });
    }
    r.bytes(len.into())
}
