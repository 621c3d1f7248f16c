//! Text positions as the protocol counts them (lines, and UTF-16 code units within a
//! line), edits, and JSON-RPC framing on a byte stream.

use lsp_types as lt;
use std::io::{BufRead, Write};

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

/// Reads one `Content-Length` framed message body; `None` at the end of the input.
pub fn read_frame(r: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut len: Option<usize> = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end();
        if line.is_empty() {
            if len.is_some() {
                break;
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok();
            }
        }
    }
    let len = len.unwrap_or(0);
    if len > 1 << 28 {
        // Too large to hold: skip it; the empty body is then answered as malformed.
        std::io::copy(
            &mut std::io::Read::take(&mut *r, len as u64),
            &mut std::io::sink(),
        )?;
        return Ok(Some(Vec::new()));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Writes one framed message.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> std::io::Result<()> {
    write!(w, "Content-Length: {}\r\n\r\n", body.len())?;
    w.write_all(body)?;
    w.flush()
}
