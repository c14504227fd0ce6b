//! The entries a script hands a worker, packed (`cut.lua` says why): one
//! MessagePack string of `{{id, {name, value, ...}, (count,) size}, ...}`
//! as Redis's `cmsgpack` writes it, read here without a copy.

use super::{Delivery, QueueError};
use crate::untrusted;
use redis::Value;

/// One entry of a packed reply (`cut.lua` says why they are packed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Packed<'a> {
    pub(super) id: &'a [u8],
    /// Its delivery count, where the script read it (`reclaim.lua`).
    pub(super) count: Option<u64>,
    /// Its size in bytes when `cut.lua` cut it; 0 when intact.
    pub(super) size: u64,
    /// Its `[name, value, ...]` items, as cut.
    pub(super) flat: Vec<&'a [u8]>,
}

impl Packed<'_> {
    /// The entry as a [`Delivery`]: a cut entry is a defect whatever else
    /// it holds. Without a count from the script it is on its first
    /// delivery (`take.lua` reads new entries only).
    pub(super) fn delivery(&self) -> Delivery {
        let mut d = Delivery::parse(
            untrusted::lossy(self.id),
            &self.flat,
            self.count.unwrap_or(1),
        );
        if self.size > 0 {
            d.cut_in_redis(self.size);
        }
        d
    }
}

/// The entries of a packed reply, in order: the MessagePack of
/// `{{id, {name, value, ...}, (count,) size}, ...}` as Redis's `cmsgpack`
/// writes it (arrays, strings, non-negative integers). `None` if it does
/// not read as that: only a script out of step with this reader could
/// send it, since every string carries its length and an entry's bytes
/// cannot break the framing.
pub(super) fn unpack(mut b: &[u8]) -> Option<Vec<Packed<'_>>> {
    let n = array(&mut b)?;
    let mut out = Vec::with_capacity(n.min(b.len()));
    for _ in 0..n {
        let parts = array(&mut b)?;
        let id = string(&mut b)?;
        let fields = array(&mut b)?;
        let flat = (0..fields)
            .map(|_| string(&mut b))
            .collect::<Option<Vec<_>>>()?;
        let count = match parts {
            3 => None,
            4 => Some(integer(&mut b)?),
            _ => return None,
        };
        let size = integer(&mut b)?;
        out.push(Packed {
            id,
            count,
            size,
            flat,
        });
    }
    b.is_empty().then_some(out)
}

/// `n` bytes from the front of `b`.
fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = (b.get(..n)?, &b[n..]);
    *b = rest;
    Some(head)
}

/// A big-endian unsigned number of `n` bytes (1, 2, 4 or 8).
fn be(b: &mut &[u8], n: usize) -> Option<u64> {
    Some(take(b, n)?.iter().fold(0, |v, &x| v << 8 | u64::from(x)))
}

/// A MessagePack array's length.
fn array(b: &mut &[u8]) -> Option<usize> {
    let n = match take(b, 1)?[0] {
        t @ 0x90..=0x9f => u64::from(t & 0x0f),
        0xdc => be(b, 2)?,
        0xdd => be(b, 4)?,
        _ => return None,
    };
    usize::try_from(n).ok()
}

/// A MessagePack string (or binary) as its bytes.
fn string<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = match take(b, 1)?[0] {
        t @ 0xa0..=0xbf => u64::from(t & 0x1f),
        0xc4 | 0xd9 => be(b, 1)?,
        0xc5 | 0xda => be(b, 2)?,
        0xc6 | 0xdb => be(b, 4)?,
        _ => return None,
    };
    take(b, usize::try_from(n).ok()?)
}

/// A non-negative MessagePack integer.
fn integer(b: &mut &[u8]) -> Option<u64> {
    match take(b, 1)?[0] {
        t @ 0x00..=0x7f => Some(u64::from(t)),
        0xcc => be(b, 1),
        0xcd => be(b, 2),
        0xce => be(b, 4),
        0xcf => be(b, 8),
        _ => None,
    }
}

/// The entries of the packed reply `packed` of script `op` (`None`: the
/// reply had no string there), or [`QueueError::Reply`] naming it.
pub(super) fn unpack_reply<'a>(
    op: &'static str,
    packed: Option<&'a Value>,
) -> Result<Vec<Packed<'a>>, QueueError> {
    packed
        .and_then(super::delivery::bytes)
        .and_then(unpack)
        .ok_or_else(|| QueueError::Reply(op, untrusted::truncate(&format!("{packed:?}"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Defect;

    /// What Redis 7's `cmsgpack.pack({{'1-0', {}, 0}, {'2-0', {'a', 'b'},
    /// 5}})` returned, byte for byte: an entry deleted while pending (no
    /// fields) and one cut to a size of 5.
    const FROM_REDIS: &[u8] = &[
        0x92, 0x93, 0xa3, b'1', b'-', b'0', 0x90, 0x00, 0x93, 0xa3, b'2', b'-', b'0', 0x92, 0xa1,
        b'a', 0xa1, b'b', 0x05,
    ];

    /// Written as `cmsgpack` writes entries: arrays, strings of any bytes,
    /// non-negative integers, each in its widest form here.
    fn pack(entries: &[Packed]) -> Vec<u8> {
        let mut out = vec![0xdd];
        out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
        for e in entries {
            out.push(if e.count.is_some() { 0x94 } else { 0x93 });
            out.push(0xdb);
            out.extend_from_slice(&(e.id.len() as u32).to_be_bytes());
            out.extend_from_slice(e.id);
            out.push(0xdc);
            out.extend_from_slice(&(e.flat.len() as u16).to_be_bytes());
            for v in &e.flat {
                out.push(0xd9);
                out.push(v.len() as u8);
                out.extend_from_slice(v);
            }
            for n in e.count.iter().chain([&e.size]) {
                out.push(0xcf);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        out
    }

    /// Strings carry their length, so a value holding bytes that are not
    /// UTF-8 or nothing at all reads back as written; a cut entry is a
    /// defect; a delivery count is read where the script sent one.
    #[test]
    fn packed_entries_read_back_whatever_their_bytes() {
        let got = unpack(FROM_REDIS).expect("Redis's own packing");
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].id, got[0].size), (&b"1-0"[..], 0));
        assert!(got[0].flat.is_empty());
        assert_eq!(got[1].flat, vec![b"a" as &[u8], b"b"]);
        assert_eq!(got[1].delivery().defect(), Some(&Defect::Oversize(5)));

        let sent = vec![
            Packed {
                id: b"1-0",
                count: None,
                size: 0,
                flat: vec![b"slot", b"a:2026-12-04:1", b"caller", b""],
            },
            Packed {
                id: b"3-0",
                count: Some(7),
                size: 0,
                flat: vec![b"slot", &[0xff, 0xc0]],
            },
        ];
        let all = pack(&sent);
        let got = unpack(&all).expect("a well-formed reply");
        assert_eq!(got, sent);
        let first = got[0].delivery();
        assert_eq!(first.defect(), None);
        assert_eq!(first.slot(), Some("a:2026-12-04:1"));
        assert_eq!(first.caller.as_deref(), Some(""));
        assert_eq!(first.deliveries, 1);
        let second = got[1].delivery();
        assert!(matches!(second.defect(), Some(Defect::ValueNotUtf8(_))));
        assert_eq!(second.deliveries, 7);
    }

    /// A reply that does not read as packed entries (a script out of step
    /// with the reader) is refused whole.
    #[test]
    fn a_reply_out_of_framing_is_refused() {
        let mut trailing = FROM_REDIS.to_vec();
        trailing.push(0x00);
        let mut negative = FROM_REDIS.to_vec();
        *negative.last_mut().unwrap() = 0xff; // size -1
        let bad: [&[u8]; 5] = [
            &FROM_REDIS[..FROM_REDIS.len() - 1], // the last size missing
            &FROM_REDIS[..4],                    // a string cut short
            &trailing,                           // bytes after the entries
            &negative,                           // a size below zero
            b"",                                 // no array at all
        ];
        for b in bad {
            assert_eq!(unpack(b), None, "{b:?}");
        }
    }
}
