//! Newline-delimited frames: the one codec for the host's stdio and the bus.
//!
//! A frame is one line of UTF-8 ending in `\n` (a trailing `\r` is dropped).
//! The decoder never fails the stream for a bad line: an oversized line or a
//! line that is not UTF-8 comes out as a [`Frame`] variant of its own so the
//! caller decides what that costs (stdio answers with an error and goes on; the
//! bus closes only that connection). Buffered memory stays bounded by the
//! frame limit even while a huge line streams in, because the rest of an
//! oversized line is discarded as it arrives.

use bytes::{Buf, BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Largest accepted frame, newline excluded (docs/DESIGN.md, "The host
/// protocol" and "The bus").
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// One decoded line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line without its terminator.
    Line(String),
    /// A line longer than the limit; `len` is how many bytes were seen (at least
    /// the limit + 1; the rest was discarded without being buffered).
    Oversized { len: usize },
    /// A line that is not valid UTF-8.
    NotUtf8,
}

/// Codec for [`Frame`]s on the way in and `&str`/`String` lines on the way out.
#[derive(Debug, Clone)]
pub struct LineCodec {
    max: usize,
    /// Bytes of an oversized line seen so far, while its tail is discarded.
    discarding: Option<usize>,
    /// How far `buf` has been searched for `\n` already.
    scanned: usize,
}

impl Default for LineCodec {
    fn default() -> Self {
        Self::new(MAX_FRAME_BYTES)
    }
}

impl LineCodec {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            discarding: None,
            scanned: 0,
        }
    }
}

fn line_from(mut bytes: BytesMut) -> Frame {
    if bytes.last() == Some(&b'\r') {
        bytes.truncate(bytes.len() - 1);
    }
    match String::from_utf8(bytes.to_vec()) {
        Ok(s) => Frame::Line(s),
        Err(_) => Frame::NotUtf8,
    }
}

impl Decoder for LineCodec {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        loop {
            if let Some(seen) = self.discarding {
                match buf.iter().position(|b| *b == b'\n') {
                    Some(pos) => {
                        buf.advance(pos + 1);
                        self.discarding = None;
                        return Ok(Some(Frame::Oversized { len: seen + pos }));
                    }
                    None => {
                        self.discarding = Some(seen + buf.len());
                        buf.clear();
                        return Ok(None);
                    }
                }
            }
            let start = self.scanned.min(buf.len());
            match buf[start..].iter().position(|b| *b == b'\n') {
                Some(rel) => {
                    let pos = start + rel;
                    self.scanned = 0;
                    let mut line = buf.split_to(pos + 1);
                    line.truncate(pos);
                    let len = if line.last() == Some(&b'\r') {
                        pos - 1
                    } else {
                        pos
                    };
                    if len > self.max {
                        return Ok(Some(Frame::Oversized { len }));
                    }
                    return Ok(Some(line_from(line)));
                }
                None if buf.len() > self.max + 1 => {
                    // Too long already: drop what we hold and skip to the newline.
                    self.scanned = 0;
                    self.discarding = Some(buf.len());
                    buf.clear();
                    continue;
                }
                None => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        if let Some(seen) = self.discarding.take() {
            return Ok(Some(Frame::Oversized { len: seen }));
        }
        if buf.is_empty() {
            return Ok(None);
        }
        // A last line without a terminator still counts as a line, measured
        // like any other: without its `\r`.
        self.scanned = 0;
        let line = buf.split();
        let len = line.len() - usize::from(line.last() == Some(&b'\r'));
        if len > self.max {
            return Ok(Some(Frame::Oversized { len }));
        }
        Ok(Some(line_from(line)))
    }
}

impl<T: AsRef<str>> Encoder<T> for LineCodec {
    type Error = std::io::Error;

    fn encode(&mut self, line: T, buf: &mut BytesMut) -> Result<(), Self::Error> {
        let line = line.as_ref();
        debug_assert!(!line.contains('\n'), "a frame must be a single line");
        buf.reserve(line.len() + 1);
        buf.put_slice(line.as_bytes());
        buf.put_u8(b'\n');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut LineCodec, input: &[u8], chunk: usize) -> Vec<Frame> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(f) = codec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        while let Some(f) = codec.decode_eof(&mut buf).unwrap() {
            out.push(f);
        }
        out
    }

    #[test]
    fn splits_lines_and_accepts_crlf() {
        let frames = decode_all(&mut LineCodec::default(), b"a\r\nbc\n\nlast", 3);
        assert_eq!(
            frames,
            vec![
                Frame::Line("a".into()),
                Frame::Line("bc".into()),
                Frame::Line(String::new()),
                Frame::Line("last".into()),
            ]
        );
    }

    #[test]
    fn oversized_line_is_reported_and_the_stream_goes_on() {
        let mut input = vec![b'x'; 50];
        input.extend_from_slice(b"\nok\n");
        for chunk in [1, 7, 64] {
            let frames = decode_all(&mut LineCodec::new(10), &input, chunk);
            assert_eq!(
                frames,
                vec![Frame::Oversized { len: 50 }, Frame::Line("ok".into())],
                "chunk size {chunk}"
            );
        }
    }

    #[test]
    fn exactly_the_limit_is_accepted() {
        let frames = decode_all(&mut LineCodec::new(4), b"abcd\r\nabcde\n", 2);
        assert_eq!(
            frames,
            vec![Frame::Line("abcd".into()), Frame::Oversized { len: 5 }]
        );
    }

    #[test]
    fn an_unterminated_last_line_is_measured_without_its_cr() {
        let frames = decode_all(&mut LineCodec::new(6), b"aaaaaa\r", 3);
        assert_eq!(frames, vec![Frame::Line("aaaaaa".into())]);
    }

    #[test]
    fn invalid_utf8_is_its_own_frame() {
        let frames = decode_all(&mut LineCodec::default(), b"\xff\xfe\nok\n", 100);
        assert_eq!(frames, vec![Frame::NotUtf8, Frame::Line("ok".into())]);
    }

    #[test]
    fn buffer_stays_bounded_while_discarding() {
        let mut codec = LineCodec::new(16);
        let mut buf = BytesMut::new();
        for _ in 0..1000 {
            buf.extend_from_slice(&[b'y'; 100]);
            assert!(codec.decode(&mut buf).unwrap().is_none());
            assert!(buf.len() <= 117);
        }
        buf.extend_from_slice(b"\n");
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::Oversized { len: 100_000 })
        );
    }

    #[test]
    fn encodes_with_newline() {
        let mut buf = BytesMut::new();
        LineCodec::default().encode("{}", &mut buf).unwrap();
        assert_eq!(&buf[..], b"{}\n");
    }
}
