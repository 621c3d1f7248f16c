//! Text positions as the protocol counts them (lines, and UTF-16 code units within a
//! line), edits, and JSON-RPC framing on a byte stream.

use lsp_types as lt;
use std::io::{Read, Write};

/// Where each line of a text starts.
pub struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    /// Lines end at `\n`, `\r\n` or a lone `\r`, as the protocol counts them.
    pub fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        let b = text.as_bytes();
        for (i, &c) in b.iter().enumerate() {
            if c == b'\n' || (c == b'\r' && b.get(i + 1) != Some(&b'\n')) {
                starts.push(i + 1);
            }
        }
        LineIndex { starts }
    }

    /// The byte offset of a position, clamped as the protocol says: a character past
    /// the end of its line is the line's end, and a line past the last is the end of
    /// the text. `None` never happens for clamped positions; kept for callers that
    /// want to refuse instead.
    pub fn offset(&self, text: &str, p: lt::Position) -> Option<usize> {
        let line = p.line as usize;
        if line >= self.starts.len() {
            return Some(text.len());
        }
        let start = self.starts[line];
        let end = self.starts.get(line + 1).map_or(text.len(), |&e| e);
        let line_text = &text[start..end];
        let line_text = line_text.strip_suffix('\n').unwrap_or(line_text);
        let line_text = line_text.strip_suffix('\r').unwrap_or(line_text);
        let mut units = 0u32;
        for (i, c) in line_text.char_indices() {
            if units >= p.character {
                return Some(start + i);
            }
            units += c.len_utf16() as u32;
        }
        Some(start + line_text.len())
    }

    /// The position of a byte offset (which must be within the text).
    pub fn position(&self, text: &str, offset: usize) -> lt::Position {
        let offset = offset.min(text.len());
        let line = self.starts.partition_point(|&s| s <= offset) - 1;
        let start = self.starts[line];
        let mut at = offset;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let character: usize = text[start..at].chars().map(char::len_utf16).sum();
        lt::Position {
            line: line as u32,
            character: character as u32,
        }
    }
}

/// Applies one change of `textDocument/didChange` to a text. A range whose start comes
/// after its end is refused, and the text is left as it was.
pub fn apply_change(
    text: &mut String,
    c: &lt::TextDocumentContentChangeEvent,
) -> Result<(), String> {
    let Some(r) = c.range else {
        *text = c.text.clone();
        return Ok(());
    };
    let idx = LineIndex::new(text);
    let a = idx.offset(text, r.start).unwrap_or(text.len());
    let b = idx.offset(text, r.end).unwrap_or(text.len());
    if a > b {
        return Err(format!(
            "the range {}:{}-{}:{} ends before it starts",
            r.start.line, r.start.character, r.end.line, r.end.character
        ));
    }
    text.replace_range(a..b, &c.text);
    Ok(())
}

/// The header that starts a frame, as it is searched for (case-insensitively).
const CONTENT_LENGTH: &[u8] = b"content-length:";
/// The longest header line kept: a longer one is the body of a bad frame read as
/// headers, and only a header at its end can matter.
const MAX_HEADER_LINE: usize = 1 << 16;
/// The largest body read into memory; a larger one is skipped.
const MAX_BODY: usize = 1 << 28;

/// Reads `Content-Length` framed message bodies from a byte stream, and finds the next
/// frame again after a bad one. Header lines are bytes (a line that is not UTF-8 is
/// skipped like any unknown header), and a `Content-Length:` header is recognised
/// anywhere in a line, so that one that follows a body without a line break (a body
/// shorter than its `Content-Length`, or a header block without one) still starts the
/// next frame.
pub struct FrameReader<R> {
    r: R,
    buf: Vec<u8>,
    pos: usize,
}

impl<R: Read> FrameReader<R> {
    pub fn new(r: R) -> FrameReader<R> {
        FrameReader {
            r,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// The next body; `None` at the end of the input. A body over `MAX_BODY` bytes is
    /// skipped and given as empty (which is then answered as malformed).
    pub fn next_body(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut len: Option<usize> = None;
        loop {
            let Some(line) = self.read_line()? else {
                return Ok(None);
            };
            let blank = line.iter().all(|&b| b == b'\r' || b == b'\n');
            if blank {
                // The end of a header block; without a valid length, whatever follows
                // is read as headers until the next `Content-Length:`.
                match len {
                    Some(n) => return self.read_body(n),
                    None => continue,
                }
            }
            if let Some(value) = header_value(&line) {
                len = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok());
            }
        }
    }

    /// Reads on from the first `Content-Length:` header inside `body`, a body that was
    /// not a message: its frame's length was too large, and it holds the start of the
    /// next frame.
    pub fn resync(&mut self, body: &[u8]) {
        if let Some(at) = find_ignore_case(body, CONTENT_LENGTH) {
            let rest = self.buf.split_off(self.pos);
            self.buf.clear();
            self.buf.extend_from_slice(&body[at..]);
            self.buf.extend_from_slice(&rest);
            self.pos = 0;
        }
    }

    /// Makes sure that a byte is buffered; false at the end of the input.
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.pos < self.buf.len() {
            return Ok(true);
        }
        self.buf.resize(1 << 16, 0);
        self.pos = 0;
        loop {
            match self.r.read(&mut self.buf) {
                Ok(n) => {
                    self.buf.truncate(n);
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.clear();
                    return Err(e);
                }
            }
        }
    }

    /// One line, through its `\n` (or to the end of the input), of at most
    /// `MAX_HEADER_LINE` bytes: the start of a longer one is dropped. `None` at the end.
    fn read_line(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut line = Vec::new();
        while self.fill()? {
            let avail = &self.buf[self.pos..];
            let (take, done) = match avail.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (avail.len(), false),
            };
            line.extend_from_slice(&avail[..take]);
            self.pos += take;
            if line.len() > MAX_HEADER_LINE {
                line.drain(..line.len() - MAX_HEADER_LINE);
            }
            if done {
                return Ok(Some(line));
            }
        }
        Ok((!line.is_empty()).then_some(line))
    }

    /// `len` bytes; `None` if the input ends first.
    fn read_body(&mut self, len: usize) -> std::io::Result<Option<Vec<u8>>> {
        let keep = len <= MAX_BODY;
        let mut body = Vec::with_capacity(if keep { len.min(1 << 20) } else { 0 });
        let mut left = len;
        while left > 0 {
            if !self.fill()? {
                return Ok(None);
            }
            let take = left.min(self.buf.len() - self.pos);
            if keep {
                body.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            }
            self.pos += take;
            left -= take;
        }
        Ok(Some(body))
    }
}

/// The value of the last `Content-Length:` header in a line, if any.
fn header_value(line: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    let mut from = 0;
    while let Some(i) = find_ignore_case(&line[from..], CONTENT_LENGTH) {
        found = Some(from + i);
        from += i + 1;
    }
    found.map(|i| &line[i + CONTENT_LENGTH.len()..])
}

/// Where `needle` (lower case ASCII) first occurs in `hay`, ignoring ASCII case.
fn find_ignore_case(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle))
}

/// Writes one framed message.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> std::io::Result<()> {
    write!(w, "Content-Length: {}\r\n\r\n", body.len())?;
    w.write_all(body)?;
    w.flush()
}
