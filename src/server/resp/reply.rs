//! Writing replies in RESP2 or RESP3, whichever the connection speaks
//! (HELLO 3 switches it): only maps and nulls differ between the two here.

use bytes::{BufMut, BytesMut};
use std::fmt::Write;

/// Appends replies to a connection's write buffer.
pub(super) struct Reply<'a> {
    pub buf: &'a mut BytesMut,
    pub resp3: bool,
}

impl Reply<'_> {
    /// A marker and a number (`:5`, `*3`, `$2`), without allocating.
    fn number(&mut self, marker: u8, n: i64) {
        self.buf.put_u8(marker);
        // Writing into a BytesMut cannot fail.
        let _ = write!(self.buf, "{n}\r\n");
    }

    fn line(&mut self, marker: u8, text: &[u8]) {
        self.buf.put_u8(marker);
        self.buf.put_slice(text);
        self.buf.put_slice(b"\r\n");
    }

    /// `+OK`, `+PONG`, `+QUEUED`.
    pub fn simple(&mut self, text: &str) {
        self.line(b'+', text.as_bytes());
    }

    /// `-CODE message`; the text must start with the error code (`ERR`,
    /// `NOAUTH`, ...). Line breaks in it would end the reply early, so
    /// they become spaces.
    pub fn error(&mut self, text: &str) {
        let text: Vec<u8> = text
            .bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b })
            .collect();
        self.line(b'-', &text);
    }

    pub fn int(&mut self, n: i64) {
        self.number(b':', n);
    }

    pub fn bulk(&mut self, bytes: &[u8]) {
        self.number(b'$', bytes.len() as i64);
        self.buf.put_slice(bytes);
        self.buf.put_slice(b"\r\n");
    }

    pub fn null(&mut self) {
        if self.resp3 {
            self.buf.put_slice(b"_\r\n");
        } else {
            self.buf.put_slice(b"$-1\r\n");
        }
    }

    /// An array of `n` replies, which follow.
    pub fn array(&mut self, n: usize) {
        self.number(b'*', n as i64);
    }

    /// A map of `n` pairs, which follow key, value, key, value: a RESP3
    /// map, or a flat RESP2 array of `2n`.
    pub fn map(&mut self, n: usize) {
        if self.resp3 {
            self.number(b'%', n as i64);
        } else {
            self.array(2 * n);
        }
    }

    /// A bulk string key and an integer value (a map entry).
    pub fn entry_int(&mut self, key: &str, value: i64) {
        self.bulk(key.as_bytes());
        self.int(value);
    }

    /// A bulk string key and a bulk string value (a map entry).
    pub fn entry_str(&mut self, key: &str, value: &str) {
        self.bulk(key.as_bytes());
        self.bulk(value.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(resp3: bool, f: impl FnOnce(&mut Reply)) -> String {
        let mut buf = BytesMut::new();
        f(&mut Reply {
            buf: &mut buf,
            resp3,
        });
        String::from_utf8(buf.to_vec()).unwrap()
    }

    #[test]
    fn replies_in_both_versions() {
        let all = |r: &mut Reply| {
            r.simple("OK");
            r.error("ERR bad\r\nthing");
            r.int(-1);
            r.bulk(b"hi");
            r.null();
            r.map(1);
            r.entry_int("proto", 3);
        };
        assert_eq!(
            written(false, all),
            "+OK\r\n-ERR bad  thing\r\n:-1\r\n$2\r\nhi\r\n$-1\r\n*2\r\n$5\r\nproto\r\n:3\r\n"
        );
        assert_eq!(
            written(true, all),
            "+OK\r\n-ERR bad  thing\r\n:-1\r\n$2\r\nhi\r\n_\r\n%1\r\n$5\r\nproto\r\n:3\r\n"
        );
    }
}
