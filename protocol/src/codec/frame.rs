//! Framing shared by requests and responses: splitting a frame off the read
//! buffer, reading its payload with bounds checks, and writing a frame with a
//! patched length prefix.
//!
//! Everything here is direction-agnostic; `request.rs` and `response.rs` only
//! describe payload layouts on top of it.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{DecodeError, EncodeError, FRAME_HEADER_LEN, MIN_FRAME_BODY};
use crate::message::RequestId;

/// Frame header + opcode + request id: where the payload starts.
const PAYLOAD_START: usize = FRAME_HEADER_LEN + MIN_FRAME_BODY as usize;

/// One complete frame, split off the read buffer.
pub(crate) struct Frame {
    pub opcode: u8,
    pub request_id: RequestId,
    /// The payload, a slice of the frame (keys are sliced out of it).
    pub payload: Bytes,
}

/// Splits the next complete frame off `src`.
///
/// `Ok(None)` when `src` does not hold a whole frame yet: nothing is consumed
/// and exactly the missing bytes are reserved. The length is checked against
/// `max_frame` from the header alone, before reserving anything, so a peer
/// cannot make us allocate by announcing a huge frame.
pub(crate) fn take_frame(src: &mut BytesMut, max_frame: u32) -> Result<Option<Frame>, DecodeError> {
    let len = match src.as_ref() {
        [a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]),
        short => {
            src.reserve(FRAME_HEADER_LEN - short.len());
            return Ok(None);
        }
    };
    if len < MIN_FRAME_BODY {
        return Err(DecodeError::FrameTooShort { len });
    }
    if len > max_frame {
        return Err(DecodeError::FrameTooLarge {
            len,
            max: max_frame,
        });
    }
    // Cannot fail on 64-bit targets; on 32-bit ones a length near u32::MAX
    // overflows usize, and such a frame is too large for the machine anyway.
    let frame_len = usize::try_from(len)
        .ok()
        .and_then(|len| len.checked_add(FRAME_HEADER_LEN))
        .ok_or(DecodeError::FrameTooLarge {
            len,
            max: max_frame,
        })?;
    if src.len() < frame_len {
        src.reserve(frame_len - src.len());
        return Ok(None);
    }

    let frame = src.split_to(frame_len).freeze();
    match frame.as_ref() {
        [_, _, _, _, opcode, r0, r1, r2, r3, ..] => Ok(Some(Frame {
            opcode: *opcode,
            request_id: u32::from_be_bytes([*r0, *r1, *r2, *r3]),
            // In bounds: the pattern above proved PAYLOAD_START bytes.
            payload: frame.slice(PAYLOAD_START..),
        })),
        // Unreachable: frame_len >= 4 + MIN_FRAME_BODY was checked above.
        _ => Err(DecodeError::FrameTooShort { len }),
    }
}

/// Reads a frame's payload field by field. Every read checks the remaining
/// length first and reports a shortfall as [`DecodeError::Truncated`].
pub(crate) struct PayloadReader {
    rest: Bytes,
    payload_len: usize,
    pub opcode: u8,
    pub request_id: RequestId,
}

impl PayloadReader {
    pub fn new(frame: Frame) -> Self {
        Self {
            payload_len: frame.payload.len(),
            rest: frame.payload,
            opcode: frame.opcode,
            request_id: frame.request_id,
        }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn need(&self, needed: usize) -> Result<(), DecodeError> {
        if self.rest.len() >= needed {
            Ok(())
        } else {
            Err(DecodeError::Truncated {
                request_id: self.request_id,
                opcode: self.opcode,
                offset: self.payload_len - self.rest.len(),
                needed,
                available: self.rest.len(),
            })
        }
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.rest.get_u8())
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.rest.get_u16())
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.rest.get_u32())
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        self.need(8)?;
        Ok(self.rest.get_u64())
    }

    /// The next `len` bytes, as a slice of the frame (no copy).
    pub fn bytes(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        self.need(len)?;
        Ok(self.rest.split_to(len))
    }

    /// Moves past the next `len` bytes, read in place by `read`, which is
    /// given the rest of the payload from them (at least `len` bytes): no
    /// slice of the frame taken (which takes a reference on its buffer).
    pub fn take_with<T>(
        &mut self,
        len: usize,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, DecodeError> {
        self.need(len)?;
        let value = read(&self.rest);
        self.rest.advance(len);
        Ok(value)
    }

    /// The next `N` bytes, copied (fixed-size fields such as an
    /// idempotency key).
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        self.need(N)?;
        let mut out = [0; N];
        self.rest.copy_to_slice(&mut out);
        Ok(out)
    }

    /// The next `N` bytes, copied, when that many remain; None (nothing
    /// read) otherwise, for the caller to read field by field and report
    /// the first field cut short.
    pub fn try_array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.rest.get(..N)?);
        self.rest.advance(N);
        Some(out)
    }

    /// The next `len` bytes as UTF-8 text; `field` names it in the error.
    pub fn string(&mut self, len: usize, field: &'static str) -> Result<String, DecodeError> {
        let raw = self.bytes(len)?;
        match std::str::from_utf8(&raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(DecodeError::InvalidUtf8 {
                request_id: self.request_id,
                field,
            }),
        }
    }

    /// Ends the message: the frame must hold nothing more.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                request_id: self.request_id,
                opcode: self.opcode,
                extra: self.rest.len(),
            })
        }
    }
}

/// Appends one frame to `dst`: the length prefix is reserved, `payload`
/// writes the payload, then the prefix is patched with the body length. On
/// error `dst` is truncated back to where it was, so a failed encode never
/// leaves half a frame in an output buffer.
///
/// `payload_hint` is the expected payload size, to reserve once up front.
pub(crate) fn encode_frame(
    dst: &mut BytesMut,
    opcode: u8,
    request_id: RequestId,
    payload_hint: usize,
    payload: impl FnOnce(&mut BytesMut) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = dst.len();
    dst.reserve(PAYLOAD_START.saturating_add(payload_hint));
    dst.put_u32(0); // patched below
    dst.put_u8(opcode);
    dst.put_u32(request_id);
    if let Err(e) = payload(dst) {
        dst.truncate(start);
        return Err(e);
    }
    let body_len = dst.len() - start - FRAME_HEADER_LEN;
    let Ok(len) = u32::try_from(body_len) else {
        dst.truncate(start);
        return Err(EncodeError::FrameTooLarge { len: body_len });
    };
    dst[start..start + FRAME_HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// The error for a field whose value its layout does not allow.
pub(crate) fn invalid(r: &PayloadReader, field: &'static str, value: u64) -> DecodeError {
    DecodeError::InvalidValue {
        request_id: r.request_id,
        opcode: r.opcode,
        field,
        value,
    }
}

/// A `u8`-length-prefixed UTF-8 string.
pub(crate) fn short_string(
    r: &mut PayloadReader,
    field: &'static str,
) -> Result<String, DecodeError> {
    let len = r.u8()?;
    r.string(len.into(), field)
}

pub(crate) fn put_short_string(
    dst: &mut BytesMut,
    s: &str,
    field: &'static str,
) -> Result<(), EncodeError> {
    dst.put_u8(wire_len(s.len(), field, u8::MAX)?);
    dst.put_slice(s.as_bytes());
    Ok(())
}

/// Converts a length or count to its wire type, or names the field that
/// overflowed.
pub(crate) fn wire_len<T: TryFrom<usize> + Into<u64>>(
    len: usize,
    field: &'static str,
    max: T,
) -> Result<T, EncodeError> {
    T::try_from(len).map_err(|_| EncodeError::TooLong {
        field,
        len,
        // The max of a u8/u16/u32 always fits usize on supported targets.
        max: usize::try_from(max.into()).unwrap_or(usize::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_checked_before_any_reserve() {
        let mut src = BytesMut::new();
        src.extend_from_slice(&u32::MAX.to_be_bytes());
        let cap = src.capacity();
        let err = take_frame(&mut src, 1024).err().expect("too large");
        assert!(matches!(
            err,
            DecodeError::FrameTooLarge {
                len: u32::MAX,
                max: 1024
            }
        ));
        assert_eq!(src.capacity(), cap, "nothing reserved for a refused frame");
        assert_eq!(src.len(), 4, "nothing consumed");
    }

    #[test]
    fn partial_frame_reserves_the_missing_bytes() {
        let mut src = BytesMut::new();
        src.extend_from_slice(&[0, 0, 0, 100, 1, 2]);
        assert!(take_frame(&mut src, 1024).expect("fine").is_none());
        assert!(src.capacity() >= 104);
        assert_eq!(&src[..], &[0, 0, 0, 100, 1, 2]);
    }

    #[test]
    fn failed_encode_leaves_the_buffer_as_it_was() {
        let mut dst = BytesMut::from(&b"kept"[..]);
        let err = encode_frame(&mut dst, 1, 7, 0, |dst| {
            dst.put_slice(b"half a payload");
            Err(EncodeError::TooLong {
                field: "x",
                len: 300,
                max: 255,
            })
        });
        assert!(err.is_err());
        assert_eq!(&dst[..], b"kept");
    }

    #[test]
    fn wire_len_names_the_field() {
        assert_eq!(wire_len(255, "name", u8::MAX).ok(), Some(255u8));
        let err = wire_len::<u8>(256, "name", u8::MAX).expect_err("overflow");
        assert!(matches!(
            err,
            EncodeError::TooLong {
                field: "name",
                len: 256,
                max: 255
            }
        ));
    }
}
