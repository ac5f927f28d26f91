//! Reading client commands off a RESP stream: a command is an array of
//! bulk strings (`*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n`), or an inline line of
//! words (`PING hi\r\n`) as typed into a raw socket.
//!
//! Invariants:
//! - bounded before it is buffered: an array longer than `max_args`, a bulk
//!   string longer than `max_arg_len` or an inline line longer than
//!   [`Limits::max_inline`] is a [`ParseError`] as soon as its header is
//!   read, so a client cannot make the server hold more than one bounded
//!   command it has not finished sending;
//! - nothing is consumed until a command is complete (`Ok(None)`: wait for
//!   more bytes); a complete command is cut off the buffer whole and its
//!   arguments are slices of it (no copy);
//! - every malformed input is an error, never a panic; after one the
//!   stream cannot be framed any more and the connection answers the
//!   error and closes, as Redis does.

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

/// A command: its name and arguments, as sent.
pub(super) type Args = SmallVec<[Bytes; 8]>;

/// How large a command may be.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Most elements of a command array, the name included.
    pub max_args: usize,
    /// Longest element, in bytes.
    pub max_arg_len: usize,
}

impl Limits {
    /// Longest inline command line.
    pub fn max_inline(&self) -> usize {
        self.max_arg_len.saturating_mul(4)
    }
}

/// Why the stream cannot be read as commands any more. The messages are
/// Redis's own, so clients show what they would show against Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ParseError {
    #[error("Protocol error: invalid multibulk length")]
    BadArrayLength,
    #[error("Protocol error: too many arguments in one command ({count}, at most {max})")]
    TooManyArgs { count: u64, max: usize },
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    #[error("Protocol error: invalid bulk length")]
    BadBulkLength,
    #[error("Protocol error: argument of {len} bytes (at most {max})")]
    ArgTooLong { len: u64, max: usize },
    #[error("Protocol error: bulk string not followed by CRLF")]
    MissingCrlf,
    #[error("Protocol error: too big inline request (at most {0} bytes)")]
    InlineTooLong(usize),
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
}

/// Cuts the next complete command off `buf`. `Ok(None)`: not complete yet
/// (nothing consumed). An empty command (`*0`, a blank line) is returned
/// as empty [`Args`]: Redis ignores it, so does the caller.
pub(super) fn parse(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Args>, ParseError> {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => parse_array(buf, limits),
        Some(_) => parse_inline(buf, limits),
    }
}

/// A CRLF-terminated line starting at `from`: its end (the index of `\r`),
/// None when the CRLF has not arrived. `max` bounds how far to look.
fn line_end(buf: &[u8], from: usize, max: usize) -> Result<Option<usize>, ()> {
    let window = &buf[from..buf.len().min(from.saturating_add(max + 2))];
    match window.iter().position(|&b| b == b'\n') {
        Some(i) if i > 0 && window[i - 1] == b'\r' => Ok(Some(from + i - 1)),
        Some(_) => Err(()),
        None if window.len() >= max + 2 => Err(()),
        None => Ok(None),
    }
}

/// A header's decimal number (`*3`, `$17`): digits only, at most 19 of
/// them; `-1` (a null) is reported as None.
fn header_number(digits: &[u8]) -> Result<Option<u64>, ()> {
    if digits == b"-1" {
        return Ok(None);
    }
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    Ok(Some(
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    ))
}

/// Longest header line: a marker and 19 digits.
const MAX_HEADER: usize = 20;

fn parse_array(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Args>, ParseError> {
    let Some(end) = line_end(buf, 0, MAX_HEADER).map_err(|_| ParseError::BadArrayLength)? else {
        return Ok(None);
    };
    // `*-1` (None): a null array, ignored like `*0`.
    let count: u64 = header_number(&buf[1..end])
        .map_err(|_| ParseError::BadArrayLength)?
        .unwrap_or_default();
    if count > limits.max_args as u64 {
        return Err(ParseError::TooManyArgs {
            count,
            max: limits.max_args,
        });
    }
    let mut ranges: SmallVec<[(usize, usize); 8]> = SmallVec::new();
    let mut at = end + 2;
    for _ in 0..count {
        let Some(&marker) = buf.get(at) else {
            return Ok(None);
        };
        if marker != b'$' {
            return Err(ParseError::ExpectedBulk(char::from(marker)));
        }
        let Some(end) = line_end(buf, at, MAX_HEADER).map_err(|_| ParseError::BadBulkLength)?
        else {
            return Ok(None);
        };
        let len = header_number(&buf[at + 1..end])
            .map_err(|_| ParseError::BadBulkLength)?
            .ok_or(ParseError::BadBulkLength)?;
        if len > limits.max_arg_len as u64 {
            return Err(ParseError::ArgTooLong {
                len,
                max: limits.max_arg_len,
            });
        }
        let start = end + 2;
        let stop = start + len as usize;
        if buf.len() < stop + 2 {
            return Ok(None);
        }
        if &buf[stop..stop + 2] != b"\r\n" {
            return Err(ParseError::MissingCrlf);
        }
        ranges.push((start, stop));
        at = stop + 2;
    }
    let frame = buf.split_to(at).freeze();
    Ok(Some(
        ranges.iter().map(|&(a, b)| frame.slice(a..b)).collect(),
    ))
}

fn parse_inline(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Args>, ParseError> {
    let max = limits.max_inline();
    let window = &buf[..buf.len().min(max + 1)];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        if window.len() > max {
            return Err(ParseError::InlineTooLong(max));
        }
        return Ok(None);
    };
    let line = buf.split_to(newline + 1).freeze();
    let text = line.slice(..newline);
    let text = text.strip_suffix(b"\r").unwrap_or(&text);
    let args = split_words(text)?;
    if args.len() > limits.max_args {
        return Err(ParseError::TooManyArgs {
            count: args.len() as u64,
            max: limits.max_args,
        });
    }
    Ok(Some(args))
}

/// Inline words: split on spaces and tabs; a word may be double-quoted
/// (with `\"` and `\\` escapes) or single-quoted, as redis-cli writes them.
fn split_words(text: &[u8]) -> Result<Args, ParseError> {
    let mut args = Args::new();
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b' ' | b'\t' => i += 1,
            quote @ (b'"' | b'\'') => {
                let mut word = Vec::new();
                i += 1;
                loop {
                    match text.get(i) {
                        None => return Err(ParseError::UnbalancedQuotes),
                        Some(&c) if c == quote => break,
                        Some(b'\\') if quote == b'"' && i + 1 < text.len() => {
                            word.push(text[i + 1]);
                            i += 2;
                        }
                        Some(&c) => {
                            word.push(c);
                            i += 1;
                        }
                    }
                }
                i += 1;
                args.push(Bytes::from(word));
            }
            _ => {
                let start = i;
                while i < text.len() && !matches!(text[i], b' ' | b'\t') {
                    i += 1;
                }
                args.push(Bytes::copy_from_slice(&text[start..i]));
            }
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits {
        max_args: 8,
        max_arg_len: 16,
    };

    fn parse_all(input: &[u8]) -> (Vec<Vec<String>>, BytesMut) {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(args) = parse(&mut buf, &LIMITS).unwrap() {
            out.push(
                args.iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect(),
            );
        }
        (out, buf)
    }

    #[test]
    fn arrays_of_bulk_strings_pipelined() {
        let (cmds, rest) = parse_all(
            b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n*2\r\n$3\r\nGE",
        );
        assert_eq!(cmds, vec![vec!["PING"], vec!["SET", "k", ""]]);
        // The partial third command stays buffered, untouched.
        assert_eq!(&rest[..], b"*2\r\n$3\r\nGE");
    }

    #[test]
    fn every_prefix_of_a_command_waits() {
        let whole = b"*3\r\n$11\r\nCL.THROTTLE\r\n$4\r\nuser\r\n$2\r\n15\r\n";
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(parse(&mut buf, &LIMITS), Ok(None), "cut at {cut}");
            assert_eq!(buf.len(), cut);
        }
        let mut buf = BytesMut::from(&whole[..]);
        let args = parse(&mut buf, &LIMITS).unwrap().unwrap();
        assert_eq!(args.len(), 3);
        assert!(buf.is_empty());
    }

    #[test]
    fn inline_commands_with_quotes() {
        let (cmds, rest) = parse_all(b"PING\r\nset \"a b\" 'c d'  \"x\\\"y\"\nINCR k");
        assert_eq!(cmds, vec![vec!["PING"], vec!["set", "a b", "c d", "x\"y"]]);
        assert_eq!(&rest[..], b"INCR k");
        assert_eq!(parse_all(b"\r\n").0, vec![Vec::<String>::new()]);
    }

    #[test]
    fn bounds_are_errors_before_the_data_arrives() {
        let mut buf = BytesMut::from(&b"*9\r\n"[..]);
        assert_eq!(
            parse(&mut buf, &LIMITS),
            Err(ParseError::TooManyArgs { count: 9, max: 8 })
        );
        let mut buf = BytesMut::from(&b"*1\r\n$17\r\n"[..]);
        assert_eq!(
            parse(&mut buf, &LIMITS),
            Err(ParseError::ArgTooLong { len: 17, max: 16 })
        );
        let mut buf = BytesMut::from(&b"*1\r\n$99999999999999999999\r\n"[..]);
        assert_eq!(parse(&mut buf, &LIMITS), Err(ParseError::BadBulkLength));
        let mut buf = BytesMut::from(&[b'x'; 65][..]);
        assert_eq!(parse(&mut buf, &LIMITS), Err(ParseError::InlineTooLong(64)));
    }

    #[test]
    fn malformed_input_is_an_error() {
        for bad in [
            &b"*x\r\n"[..],
            b"*1\r\n:1\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$1\r\nab\r\n",
            b"*1\n",
            b"*1\r\n$ 1\r\n",
            b"\"open\r\n",
            b"*123456789012345678901\r\n",
        ] {
            let mut buf = BytesMut::from(bad);
            assert!(parse(&mut buf, &LIMITS).is_err(), "{bad:?}");
        }
        // A null array is an empty command.
        assert_eq!(parse_all(b"*-1\r\n*0\r\n").0.len(), 2);
    }

    proptest! {
        /// Any bytes, RESP-like or not: no panic, and every command read
        /// stays within the limits; an error leaves the loop (the
        /// connection closes).
        #[test]
        fn any_input_is_commands_or_an_error(
            chunks in proptest::collection::vec(
                prop_oneof![
                    Just(b"*".to_vec()),
                    Just(b"$".to_vec()),
                    Just(b"\r\n".to_vec()),
                    Just(b"-1".to_vec()),
                    Just(b"\"".to_vec()),
                    "[0-9]{1,3}".prop_map(String::into_bytes),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ],
                0..40,
            )
        ) {
            let mut buf = BytesMut::from(&chunks.concat()[..]);
            loop {
                let before = buf.len();
                match parse(&mut buf, &LIMITS) {
                    Ok(Some(args)) => {
                        prop_assert!(args.len() <= LIMITS.max_args);
                        prop_assert!(args.iter().all(|a| a.len() <= LIMITS.max_inline()));
                        prop_assert!(buf.len() < before);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }
}
