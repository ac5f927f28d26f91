//! tokio-util `Decoder`/`Encoder` wrappers over the pure codec functions.
//!
//! They hold only the settings the functions need and add no logic, so the
//! tests of the functions cover them.
//!
//! [`ServerCodec`] yields a bad but complete frame as an item (`Err` inside
//! `Some`) and fails the stream only on fatal errors. tokio-util's
//! `FramedRead` ends the stream once after any decoder error and then reads
//! the socket again before decoding, so returning per-frame errors as decoder
//! errors would stall the frames buffered behind a bad one.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use super::{
    decode_request, decode_response, encode_request, encode_response, DecodeError, EncodeError,
    DEFAULT_CLIENT_MAX_FRAME,
};
use crate::message::{Request, RequestId, Response, ServerLimits};

/// The server side: decodes requests within `limits` (a bad frame consumed
/// whole is an item, so the stream goes on; fatal errors end it), encodes
/// responses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerCodec {
    pub limits: ServerLimits,
}

impl ServerCodec {
    pub fn new(limits: ServerLimits) -> Self {
        Self { limits }
    }
}

/// Same as [`Decoder::decode`], but the peer closing the stream inside a
/// frame is an error rather than a silent drop of the partial frame.
fn eof_inside_frame<T>(decoded: Option<T>, buf: &BytesMut) -> Result<Option<T>, DecodeError> {
    match decoded {
        None if !buf.is_empty() => Err(DecodeError::UnexpectedEof {
            buffered: buf.len(),
        }),
        decoded => Ok(decoded),
    }
}

impl Decoder for ServerCodec {
    type Item = Result<(RequestId, Request), DecodeError>;
    type Error = DecodeError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, DecodeError> {
        match decode_request(src, &self.limits) {
            Ok(decoded) => Ok(decoded.map(Ok)),
            Err(e) if e.is_fatal() => Err(e),
            Err(e) => Ok(Some(Err(e))),
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, DecodeError> {
        let decoded = self.decode(buf)?;
        eof_inside_frame(decoded, buf)
    }
}

impl Encoder<(RequestId, Response)> for ServerCodec {
    type Error = EncodeError;

    fn encode(
        &mut self,
        (id, response): (RequestId, Response),
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        encode_response(id, &response, dst)
    }
}

impl Encoder<(RequestId, &Response)> for ServerCodec {
    type Error = EncodeError;

    fn encode(
        &mut self,
        (id, response): (RequestId, &Response),
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        encode_response(id, response, dst)
    }
}

/// The client side: encodes requests, decodes responses whose body is at
/// most `max_frame` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientCodec {
    pub max_frame: u32,
}

impl ClientCodec {
    pub fn new(max_frame: u32) -> Self {
        Self { max_frame }
    }
}

impl Default for ClientCodec {
    /// Accepts any response a v1 server can send ([`DEFAULT_CLIENT_MAX_FRAME`]).
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_CLIENT_MAX_FRAME,
        }
    }
}

impl Decoder for ClientCodec {
    type Item = (RequestId, Response);
    type Error = DecodeError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, DecodeError> {
        decode_response(src, self.max_frame)
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, DecodeError> {
        let decoded = self.decode(buf)?;
        eof_inside_frame(decoded, buf)
    }
}

impl Encoder<(RequestId, Request)> for ClientCodec {
    type Error = EncodeError;

    fn encode(
        &mut self,
        (id, request): (RequestId, Request),
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        encode_request(id, &request, dst)
    }
}

impl Encoder<(RequestId, &Request)> for ClientCodec {
    type Error = EncodeError;

    fn encode(
        &mut self,
        (id, request): (RequestId, &Request),
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        encode_request(id, request, dst)
    }
}
