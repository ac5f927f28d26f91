//! The tokio-util wrappers: same bytes as the pure functions, EOF handling,
//! and the server codec's per-frame errors.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};
use tollgate_protocol::*;

use crate::samples::*;

#[test]
fn client_and_server_codecs_talk_to_each_other() {
    let mut client = ClientCodec::default();
    let mut server = ServerCodec::default();
    let mut wire = BytesMut::new();
    for (id, request) in requests() {
        client.encode((id, &request), &mut wire).expect("encodes");
        client.encode((id, request), &mut wire).expect("encodes");
    }
    for (id, request) in requests() {
        for _ in 0..2 {
            let decoded = server.decode(&mut wire).expect("decodes");
            assert_eq!(
                decoded.map(|r| r.expect("a good frame")),
                Some((id, request.clone()))
            );
        }
    }
    assert!(server.decode_eof(&mut wire).expect("clean end").is_none());

    for (id, response) in responses() {
        server.encode((id, &response), &mut wire).expect("encodes");
        server.encode((id, response), &mut wire).expect("encodes");
    }
    for (id, response) in responses() {
        for _ in 0..2 {
            assert_eq!(
                client.decode(&mut wire).expect("decodes"),
                Some((id, response.clone()))
            );
        }
    }
    assert!(client.decode_eof(&mut wire).expect("clean end").is_none());
}

#[test]
fn eof_inside_a_frame_is_a_fatal_error() {
    let frame = encode_req(1, &Request::Ping);
    let mut partial = BytesMut::from(&frame[..6]);
    let err = ServerCodec::default()
        .decode_eof(&mut partial)
        .expect_err("cut");
    assert!(matches!(err, DecodeError::UnexpectedEof { buffered: 6 }));
    assert!(err.is_fatal());

    let frame = encode_resp(1, &Response::Pong);
    let mut partial = BytesMut::from(&frame[..2]);
    let err = ClientCodec::default()
        .decode_eof(&mut partial)
        .expect_err("cut");
    assert!(matches!(err, DecodeError::UnexpectedEof { buffered: 2 }));
}

#[test]
fn server_codec_yields_bad_frames_as_items_and_goes_on() {
    let mut codec = ServerCodec::new(ServerLimits::default());
    let mut wire = raw_frame(0x42, 9, &[]);
    wire.extend_from_slice(&encode_req(10, &Request::Ping));
    let bad = codec
        .decode(&mut wire)
        .expect("not fatal")
        .expect("an item");
    let err = bad.expect_err("the bad frame");
    assert_eq!(
        (err.request_id(), err.code()),
        (Some(9), ErrorCode::UnknownOpcode)
    );
    let good = codec
        .decode(&mut wire)
        .expect("not fatal")
        .expect("an item");
    assert_eq!(good.expect("the good frame"), (10, Request::Ping));
    assert!(codec.decode_eof(&mut wire).expect("clean end").is_none());

    // Fatal errors still end the stream.
    let mut wire = BytesMut::from(&[0xFF, 0xFF, 0xFF, 0xFF][..]);
    let err = codec.decode(&mut wire).expect_err("fatal");
    assert!(matches!(err, DecodeError::FrameTooLarge { .. }));
}

#[test]
fn server_codec_passes_limits_through() {
    let mut codec = ServerCodec::new(ServerLimits {
        max_key_len: 2,
        ..ServerLimits::default()
    });
    let mut wire = encode_req(1, &Request::Reset(vec![bytes::Bytes::from_static(b"abc")]));
    let err = codec
        .decode(&mut wire)
        .expect("not fatal")
        .expect("an item")
        .expect_err("key too long");
    assert!(matches!(
        err,
        DecodeError::KeyTooLong { len: 3, max: 2, .. }
    ));
}
