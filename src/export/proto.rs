//! A protobuf writer for the few message types an ONNX file holds (`ModelProto`,
//! `GraphProto`, `NodeProto`, `TensorProto`, ...): the wire format alone, each field
//! written by number, so that est needs neither generated code nor `protoc`. ONNX's
//! `onnx.proto` is proto2, whose repeated scalars are written unpacked (one tag each),
//! as `repeated_*` does here.

/// One message being written: fields in the order they are added.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Message {
    buf: Vec<u8>,
}

/// The wire types used: varint, 64-bit, length-delimited, 32-bit.
const VARINT: u32 = 0;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

impl Message {
    pub fn new() -> Message {
        Message::default()
    }

    fn raw_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn tag(&mut self, field: u32, wire: u32) {
        self.raw_varint(u64::from(field << 3 | wire));
    }

    /// An `int32`, `int64`, `uint64` or enum field (negative numbers as ten bytes, as
    /// protobuf writes a negative `int64`).
    pub fn int(&mut self, field: u32, v: i64) -> &mut Message {
        self.tag(field, VARINT);
        self.raw_varint(v as u64);
        self
    }

    /// A `float` field.
    pub fn float(&mut self, field: u32, v: f32) -> &mut Message {
        self.tag(field, FIXED32);
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `bytes` field.
    pub fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Message {
        self.tag(field, LEN);
        self.raw_varint(b.len() as u64);
        self.buf.extend_from_slice(b);
        self
    }

    /// A `string` field.
    pub fn string(&mut self, field: u32, s: &str) -> &mut Message {
        self.bytes(field, s.as_bytes())
    }

    /// An embedded message field.
    pub fn message(&mut self, field: u32, m: &Message) -> &mut Message {
        self.bytes(field, &m.buf)
    }

    /// A repeated `int64` field, unpacked (proto2's default).
    pub fn repeated_int(&mut self, field: u32, vs: &[i64]) -> &mut Message {
        for &v in vs {
            self.int(field, v);
        }
        self
    }

    /// The message's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::Message;

    /// The encodings of protobuf's own documentation ("Encoding"): field 1 = 150 is
    /// `08 96 01`, field 2 = "testing" is `12 07 74 65 73 74 69 6e 67`, and a message
    /// holding the first as field 3 is `1a 03 08 96 01`.
    #[test]
    fn fields_encode_as_protobuf_documents_them() {
        let mut a = Message::new();
        a.int(1, 150);
        assert_eq!(a.as_bytes(), [0x08, 0x96, 0x01]);
        let mut b = Message::new();
        b.string(2, "testing");
        assert_eq!(
            b.as_bytes(),
            [0x12, 0x07, 0x74, 0x65, 0x73, 0x74, 0x69, 0x6e, 0x67]
        );
        let mut c = Message::new();
        c.message(3, &a);
        assert_eq!(c.as_bytes(), [0x1a, 0x03, 0x08, 0x96, 0x01]);
    }

    /// A negative int64 is ten bytes; a float is its four little-endian bytes after a
    /// 32-bit tag; repeated ints are one tag each; a field number above 15 takes two
    /// tag bytes (ONNX's `AttributeProto.type` is field 20: `a0 01`).
    #[test]
    fn negatives_floats_repeats_and_long_tags() {
        let mut m = Message::new();
        m.int(1, -1);
        assert_eq!(
            m.as_bytes(),
            [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        let mut f = Message::new();
        f.float(2, 1.0);
        assert_eq!(f.as_bytes(), [0x15, 0x00, 0x00, 0x80, 0x3f]);
        let mut r = Message::new();
        r.repeated_int(1, &[1, 300]);
        assert_eq!(r.as_bytes(), [0x08, 0x01, 0x08, 0xac, 0x02]);
        let mut t = Message::new();
        t.int(20, 7);
        assert_eq!(t.as_bytes(), [0xa0, 0x01, 0x07]);
    }
}
