//! The Confluent wire format: how a record's bytes name their schema.
//!
//! ```text
//! byte 0      magic byte, 0
//! bytes 1..5  schema id, a big-endian u32
//! then        Protobuf only: the message indexes, zigzag varints (a count,
//!             then that many indexes; a count of 0 alone means [0], the
//!             file's first message)
//! then        the payload in the schema's encoding
//! ```
//!
//! Parsing never panics and never allocates more than the input justifies:
//! a frame is data from the network.

// The message indexes are Protobuf's, whose decoder is the next format
// (issue 34); until it lands they are used by the tests only.
#![cfg_attr(not(test), allow(dead_code))]

/// The framing's magic byte.
pub(crate) const MAGIC: u8 = 0;

/// A framed record: the schema id and what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    pub schema_id: u32,
    pub rest: &'a [u8],
}

/// Why bytes are not a frame (`bad_framing`), or not message indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WireError(pub String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Splits the magic byte and schema id off `bytes`.
pub(crate) fn frame(bytes: &[u8]) -> Result<Frame<'_>, WireError> {
    match bytes {
        [] => Err(WireError("empty value: no magic byte".into())),
        [m, ..] if *m != MAGIC => Err(WireError(format!(
            "first byte is {m:#04x}, not the magic byte 0 of the Confluent wire format \
             (was this record produced without a registry serializer?)"
        ))),
        _ if bytes.len() < 5 => Err(WireError(format!(
            "{} bytes: shorter than the 5-byte prefix (magic byte and schema id)",
            bytes.len()
        ))),
        _ => Ok(Frame {
            schema_id: u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]),
            rest: &bytes[5..],
        }),
    }
}

/// Adds the prefix to `payload` (the bench's and the tests' producers).
pub fn framed(schema_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(MAGIC);
    out.extend_from_slice(&schema_id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Protobuf's message indexes at the start of `rest`, and the payload after
/// them. The path of indexes names a message in the schema's file: `[0]`
/// its first top-level message, `[1, 0]` the first nested message of the
/// second.
pub(crate) fn message_indexes(rest: &[u8]) -> Result<(Vec<usize>, &[u8]), WireError> {
    let (count, mut at) = zigzag(rest, 0)?;
    if count == 0 {
        return Ok((vec![0], &rest[at..]));
    }
    // Each index takes at least a byte: a count beyond what is left is a
    // lie, refused before any allocation of its size.
    let left = rest.len() - at;
    if count < 0 || count as u64 > left as u64 {
        return Err(WireError(format!(
            "message index count {count} does not fit the {left} bytes that follow"
        )));
    }
    let mut path = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (i, next) = zigzag(rest, at)?;
        if i < 0 {
            return Err(WireError(format!("negative message index {i}")));
        }
        path.push(i as usize);
        at = next;
    }
    Ok((path, &rest[at..]))
}

/// Encodes message indexes as `message_indexes` reads them ([0] as the
/// single byte 0, as Confluent's serializer writes it).
pub(crate) fn encode_message_indexes(path: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    if path == [0] {
        out.push(0);
        return out;
    }
    put_zigzag(&mut out, path.len() as i64);
    for &i in path {
        put_zigzag(&mut out, i as i64);
    }
    out
}

/// A zigzag varint of at most 32 bits at `at`, and the offset after it.
fn zigzag(bytes: &[u8], at: usize) -> Result<(i32, usize), WireError> {
    let mut raw: u64 = 0;
    for k in 0..5 {
        let Some(&b) = bytes.get(at + k) else {
            return Err(WireError(
                "message indexes end in the middle of a varint".into(),
            ));
        };
        raw |= u64::from(b & 0x7f) << (7 * k);
        if b & 0x80 == 0 {
            if raw > u64::from(u32::MAX) {
                return Err(WireError("message index varint overflows 32 bits".into()));
            }
            let u = raw as u32;
            return Ok((((u >> 1) as i32) ^ -((u & 1) as i32), at + k + 1));
        }
    }
    Err(WireError("message index varint longer than 5 bytes".into()))
}

/// Appends `v` as a zigzag varint (Protobuf's `sint64`, Avro's `long`).
pub(crate) fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    let mut u = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (u & 0x7f) as u8;
        u >>= 7;
        if u == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_short_prefix_is_bad_framing_and_five_bytes_frame() {
        let full = framed(0x0102_0304, b"payload");
        for n in 0..5 {
            let e = frame(&full[..n]).unwrap_err();
            assert!(e.0.contains("magic") || e.0.contains("5-byte"), "{n}: {e}");
        }
        let f = frame(&full[..5]).unwrap();
        assert_eq!((f.schema_id, f.rest), (0x0102_0304, &b""[..]));
        let f = frame(&full).unwrap();
        assert_eq!((f.schema_id, f.rest), (16_909_060, &b"payload"[..]));
        assert_eq!(
            frame(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap().schema_id,
            u32::MAX
        );
    }

    #[test]
    fn a_wrong_magic_byte_names_itself() {
        let e = frame(b"{\"id\": 1}").unwrap_err();
        assert!(e.0.contains("0x7b"), "{e}");
        assert!(frame(&[1, 0, 0, 0, 1]).unwrap_err().0.contains("0x01"));
    }

    #[test]
    fn message_indexes_read_as_confluent_writes_them() {
        // A single 0: the first message, as the serializer optimises it.
        assert_eq!(message_indexes(&[0, 9]).unwrap(), (vec![0], &[9u8][..]));
        // [1]: count 1 (zigzag 2), index 1 (zigzag 2).
        assert_eq!(message_indexes(&[2, 2, 7]).unwrap(), (vec![1], &[7u8][..]));
        // [2, 0, 300]: a deep path and a two-byte varint.
        let enc = encode_message_indexes(&[2, 0, 300]);
        assert_eq!(enc, [6, 4, 0, 0xd8, 0x04]);
        assert_eq!(message_indexes(&enc).unwrap(), (vec![2, 0, 300], &[][..]));
        for path in [vec![0], vec![0, 0], vec![5], vec![1, 2, 3, 4], vec![70_000]] {
            let mut b = encode_message_indexes(&path);
            b.extend_from_slice(b"rest");
            assert_eq!(message_indexes(&b).unwrap(), (path, &b"rest"[..]));
        }
    }

    #[test]
    fn hostile_message_indexes_are_refused_without_allocating_their_size() {
        let refused = |b: &[u8], want: &str| {
            let e = message_indexes(b).unwrap_err();
            assert!(e.0.contains(want), "{b:?}: {e}");
        };
        refused(&[], "middle of a varint");
        refused(&[0x80], "middle of a varint");
        refused(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01], "longer than 5 bytes");
        refused(&[0xff, 0xff, 0xff, 0xff, 0x7f], "overflows 32 bits");
        // A count of 2^30 over two bytes.
        refused(&[0x80, 0x80, 0x80, 0x80, 0x08, 1, 2], "does not fit");
        // A negative count (zigzag 1 = -1) and a negative index.
        refused(&[1], "does not fit");
        refused(&[2, 1], "negative message index");
        // Count 2 with one byte left; count 2, the second index cut short.
        refused(&[4, 2], "does not fit");
        refused(&[4, 2, 0x80], "middle of a varint");
        // The count's limits hold for each index too.
        refused(
            &[4, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            "longer than 5 bytes",
        );
        refused(&[4, 0, 0xff, 0xff, 0xff, 0xff, 0x7f], "overflows 32 bits");
        // 0xffffffff0f: 2^32 - 1, zigzag -2^31, as a count and as an index.
        refused(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0], "does not fit");
        refused(&[2, 0xff, 0xff, 0xff, 0xff, 0x0f], "negative message index");
    }

    #[test]
    fn every_short_prefix_of_message_indexes_is_refused() {
        // [2, 0, 300]: count 3, then three indexes, the last two bytes.
        let enc = encode_message_indexes(&[2, 0, 300]);
        for n in 0..enc.len() {
            assert!(message_indexes(&enc[..n]).is_err(), "{:?}", &enc[..n]);
        }
        assert!(message_indexes(&enc).is_ok());
        // A count exactly as long as the bytes left is a whole path.
        assert_eq!(message_indexes(&[4, 0, 2]).unwrap(), (vec![0, 1], &[][..]));
        // The largest index a 32-bit zigzag varint holds.
        let mut max = vec![2];
        put_zigzag(&mut max, i64::from(i32::MAX));
        assert_eq!(message_indexes(&max).unwrap().0, [i32::MAX as usize]);
    }
}
