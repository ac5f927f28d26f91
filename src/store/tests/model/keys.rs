//! The keys the model test draws from, chosen to be adversarial for the
//! split tables: which table a key goes to, and how it is compared there,
//! depends on its length (0, 16, 22 bytes) and on whether it ends in a 0
//! byte (a short slot reads its length back from its zero padding).
//!
//! Each key is `tag + body[..n] + last`: `body` is one fixed pattern
//! (with a 0 byte and bytes that are not UTF-8 in it), `last` is the
//! pattern's own next byte, that byte with one bit flipped, or 0. So for
//! every length there are keys that differ only in their last byte, and
//! `key(len + 1, 0)` is `key(len, pattern)` with a trailing 0 byte ("ab"
//! and "ab\0"). The keys of one tag share a slot (atomic groups); the
//! untagged ones spread over the stripes.

use bytes::Bytes;

/// No tag, and two hash tags (one not UTF-8).
pub const TAGS: [&[u8]; 3] = [b"", b"{a}", b"{\x80\x00}"];

/// Key lengths around the short slot (16) and the inline key (22).
const LENGTHS: [usize; 16] = [0, 1, 2, 3, 4, 8, 14, 15, 16, 17, 18, 21, 22, 23, 24, 40];

/// The body pattern: a 0 byte inside a key must be kept, and 0xff/0x80
/// are not UTF-8.
const PATTERN: [u8; 5] = [b'k', 0xff, b'z', 0x00, 0x80];

/// The keys of `tag`, shortest first (shrinking goes to the first ones).
pub fn of(tag: &[u8]) -> Vec<Bytes> {
    let mut keys = Vec::new();
    for len in LENGTHS {
        if len <= tag.len() {
            if len == 0 && tag.is_empty() {
                keys.push(Bytes::new());
            }
            continue;
        }
        let mut key = tag.to_vec();
        key.extend((0..len - tag.len() - 1).map(|i| PATTERN[i % PATTERN.len()]));
        let own = PATTERN[(len - tag.len() - 1) % PATTERN.len()];
        for last in [own, own ^ 1, 0] {
            let mut k = key.clone();
            k.push(last);
            let k = Bytes::from(k);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

/// The keys of every tag.
pub fn all() -> Vec<Bytes> {
    let mut keys: Vec<Bytes> = TAGS.iter().flat_map(|t| of(t)).collect();
    keys.sort_by_key(|k| k.len());
    keys
}

/// The width of a run of filler keys: one for each way a key is stored.
#[derive(Debug, Clone, Copy)]
pub enum Width {
    /// A short slot, padded.
    Short,
    /// A short slot, full (16 bytes).
    Sixteen,
    /// 16 bytes ending in a 0 byte: the long table, inline.
    SixteenZero,
    /// The long table, inline.
    Inline,
    /// The long table, on the heap.
    Heap,
}

impl Width {
    pub const ALL: [Width; 5] = [
        Width::Short,
        Width::Sixteen,
        Width::SixteenZero,
        Width::Inline,
        Width::Heap,
    ];
}

/// A run of `n` filler keys of one tag and width, numbered from `start`.
#[derive(Debug, Clone)]
pub struct Fill {
    /// One of [`TAGS`] (as `Bytes`, to show as `b"{a}"` in a failure).
    pub tag: Bytes,
    pub width: Width,
    pub start: u16,
    pub n: u16,
}

impl Fill {
    pub fn keys(&self) -> impl Iterator<Item = Bytes> + '_ {
        let len = match self.width {
            Width::Short => 12,
            Width::Sixteen => 16,
            Width::SixteenZero => 15,
            Width::Inline => 20,
            Width::Heap => 30,
        };
        (self.start..self.start.saturating_add(self.n)).map(move |i| {
            let digits = len - self.tag.len() - 1;
            let mut key = self.tag.to_vec();
            key.extend(format!("f{i:0digits$}").into_bytes());
            if matches!(self.width, Width::SixteenZero) {
                key.push(0);
            }
            Bytes::from(key)
        })
    }
}
