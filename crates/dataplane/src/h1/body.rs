//! Moving an HTTP/1 body from one connection to another: decode the sender's framing, encode
//! the receiver's. Chunked bodies are decoded and re-encoded rather than passed through, so the
//! receiver only ever sees framing Gatehouse wrote (no chunk extensions, no odd whitespace, no
//! trailers); bodies are streamed through fixed buffers, never held whole.

use super::buf::ReadBuf;
use super::parse::Framing;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite};

/// Hex digits of a chunk size beyond which the size cannot fit in 64 bits.
const MAX_SIZE_DIGITS: u8 = 16;
/// Longest trailer section accepted (trailers are read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;
/// Pending output is written out before more input is decoded beyond this.
const OUT_TARGET: usize = 32 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// Reading hex digits of the size; the count of digits so far.
    Size(u8),
    /// Whitespace after the size, before `;` or CR.
    SizeSpace,
    /// A chunk extension, up to CR.
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or of the final CRLF).
    TrailerStart,
    /// In a trailer field line; whether its `:` was seen.
    TrailerLine(bool),
    TrailerLf,
    EndLf,
}

/// Decodes one body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decoder {
    Length(u64),
    Chunked {
        state: Chunk,
        /// The chunk size being read, then what is left of the chunk's data.
        size: u64,
        /// Trailer bytes seen, for the limit.
        trailers: usize,
    },
    /// Until the sender closes.
    Eof,
    Done,
}

/// The body's bytes are malformed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub &'static str);

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Self {
        match framing {
            Framing::None | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked {
                state: Chunk::Size(0),
                size: 0,
                trailers: 0,
            },
            Framing::Eof => Decoder::Eof,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        *self == Decoder::Done
    }

    /// Decodes from `input`: returns how many bytes were consumed and the range of `input`
    /// that is body data (at most one range per call; call again with the rest).
    pub(crate) fn decode(
        &mut self,
        input: &[u8],
    ) -> Result<(usize, Option<std::ops::Range<usize>>), Malformed> {
        match self {
            Decoder::Done => Ok((0, None)),
            Decoder::Eof => Ok((input.len(), (!input.is_empty()).then_some(0..input.len()))),
            Decoder::Length(left) => {
                let n = input
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= n as u64;
                if *left == 0 {
                    *self = Decoder::Done;
                }
                Ok((n, (n > 0).then_some(0..n)))
            }
            Decoder::Chunked {
                state,
                size,
                trailers,
            } => {
                let mut i = 0;
                while i < input.len() {
                    let b = input[i];
                    match *state {
                        Chunk::Data => {
                            let n =
                                (input.len() - i).min(usize::try_from(*size).unwrap_or(usize::MAX));
                            *size -= n as u64;
                            if *size == 0 {
                                *state = Chunk::DataCr;
                            }
                            return Ok((i + n, Some(i..i + n)));
                        }
                        Chunk::Size(digits) => match (b as char).to_digit(16) {
                            Some(d) => {
                                if digits >= MAX_SIZE_DIGITS {
                                    return Err(Malformed("chunk size too large"));
                                }
                                *size = *size << 4 | u64::from(d);
                                *state = Chunk::Size(digits + 1);
                            }
                            None if digits == 0 => return Err(Malformed("chunk size expected")),
                            None => match b {
                                b'\r' => *state = Chunk::SizeLf,
                                b';' => *state = Chunk::Ext,
                                b' ' | b'\t' => *state = Chunk::SizeSpace,
                                _ => return Err(Malformed("invalid chunk size")),
                            },
                        },
                        Chunk::SizeSpace => match b {
                            b' ' | b'\t' => {}
                            b';' => *state = Chunk::Ext,
                            b'\r' => *state = Chunk::SizeLf,
                            _ => return Err(Malformed("invalid chunk size line")),
                        },
                        Chunk::Ext => match b {
                            b'\r' => *state = Chunk::SizeLf,
                            b'\n' | 0 => return Err(Malformed("invalid chunk extension")),
                            _ => {}
                        },
                        Chunk::SizeLf => {
                            if b != b'\n' {
                                return Err(Malformed("chunk size line must end in CRLF"));
                            }
                            *state = if *size == 0 {
                                Chunk::TrailerStart
                            } else {
                                Chunk::Data
                            };
                        }
                        Chunk::DataCr => {
                            if b != b'\r' {
                                return Err(Malformed("chunk data must end in CRLF"));
                            }
                            *state = Chunk::DataLf;
                        }
                        Chunk::DataLf => {
                            if b != b'\n' {
                                return Err(Malformed("chunk data must end in CRLF"));
                            }
                            *size = 0;
                            *state = Chunk::Size(0);
                        }
                        Chunk::TrailerStart => {
                            // Only CRLF or a field line may follow the last chunk: anything
                            // else (a bare LF, a request line) would let the next pipelined
                            // request be read as trailers.
                            *state = match b {
                                b'\r' => Chunk::EndLf,
                                b if is_tchar(b) => Chunk::TrailerLine(false),
                                _ => return Err(Malformed("invalid trailer")),
                            };
                            *trailers += 1;
                        }
                        Chunk::TrailerLine(colon) => {
                            match b {
                                b'\r' if colon => *state = Chunk::TrailerLf,
                                b':' => *state = Chunk::TrailerLine(true),
                                b'\r' | b'\n' | 0 => return Err(Malformed("invalid trailer")),
                                _ => {}
                            }
                            *trailers += 1;
                            if *trailers > MAX_TRAILERS {
                                return Err(Malformed("trailers too large"));
                            }
                        }
                        Chunk::TrailerLf => {
                            if b != b'\n' {
                                return Err(Malformed("trailer must end in CRLF"));
                            }
                            *state = Chunk::TrailerStart;
                        }
                        Chunk::EndLf => {
                            if b != b'\n' {
                                return Err(Malformed("chunked body must end in CRLF"));
                            }
                            *self = Decoder::Done;
                            return Ok((i + 1, None));
                        }
                    }
                    i += 1;
                }
                Ok((i, None))
            }
        }
    }
}

/// A `token` character (RFC 9110 §5.6.2): what a field name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// How the receiver gets the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// As is: Content-Length or close-delimited towards the receiver.
    Identity,
    Chunked,
}

impl Encoding {
    fn encode(self, data: &[u8], out: &mut Vec<u8>) {
        match self {
            Encoding::Identity => out.extend_from_slice(data),
            Encoding::Chunked => {
                let mut hex = [0u8; 16];
                out.extend_from_slice(hex_len(data.len(), &mut hex));
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    fn finish(self, out: &mut Vec<u8>) {
        if self == Encoding::Chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
    }
}

fn hex_len(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Which side of a pipe failed.
#[derive(Debug)]
pub(crate) enum PipeError {
    /// Reading (or decoding) the sender's side.
    Source(io::Error),
    /// Writing the receiver's side.
    Sink(io::Error),
}

/// One body on its way from a source connection (through its read buffer) to a sink, with
/// `out` holding bytes the sink has not taken yet. The caller may put a head in `out` first,
/// so that a head and a small body leave in one write.
#[derive(Debug)]
pub(crate) struct Pipe {
    decoder: Decoder,
    encoding: Encoding,
    /// The decoder is done and the encoding's end is in `out`.
    ended: bool,
    /// Ended, everything written and the sink flushed.
    flushed: bool,
    pub out: Vec<u8>,
    written: usize,
    /// Body bytes decoded so far.
    pub moved: u64,
    /// Bytes read from the source or written to the sink: any change is progress, for the
    /// stall timeouts.
    pub progress: u64,
    /// The last `poll_run` that returned `Pending` waited for the sink (it does not take the
    /// bytes) rather than for the source.
    pub blocked_on_sink: bool,
}

impl Pipe {
    pub(crate) fn new(out: Vec<u8>) -> Self {
        Pipe {
            decoder: Decoder::Done,
            encoding: Encoding::Identity,
            ended: false,
            flushed: false,
            out,
            written: 0,
            moved: 0,
            progress: 0,
            blocked_on_sink: false,
        }
    }

    /// Starts a body (after whatever `out` holds). `Framing::None` moves only `out`.
    pub(crate) fn start(&mut self, framing: Framing, encoding: Encoding) {
        self.decoder = Decoder::new(framing);
        self.encoding = encoding;
        self.ended = false;
        self.flushed = false;
        self.written = 0;
        self.moved = 0;
        if self.decoder.is_done() && framing != Framing::None {
            // An empty body that still has framing towards the receiver.
            self.encoding.finish(&mut self.out);
        }
        if self.decoder.is_done() {
            self.ended = true;
        }
    }

    /// Everything, body end included, was written and flushed.
    pub(crate) fn finished(&self) -> bool {
        self.flushed
    }

    /// Takes the output buffer back, emptied, for the next message.
    pub(crate) fn into_out(mut self) -> Vec<u8> {
        self.out.clear();
        self.out
    }

    /// Takes the output buffer back as it is. For a message without body that is everything
    /// the pipe was given (kept after writing), so it can be sent again elsewhere.
    pub(crate) fn into_sent(self) -> Vec<u8> {
        self.out
    }

    /// Moves bytes until the body has been written and flushed, or until either side is not
    /// ready.
    pub(crate) fn poll_run<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        source: &mut R,
        buf: &mut ReadBuf,
        sink: &mut W,
    ) -> Poll<Result<(), PipeError>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        if self.flushed {
            return Poll::Ready(Ok(()));
        }
        loop {
            // Decode first: a head waiting in `out` and the body bytes already buffered leave
            // in one write.
            if !self.ended && self.out.len() < OUT_TARGET {
                self.decode(buf).map_err(PipeError::Source)?;
            }
            self.blocked_on_sink = true;
            while self.written < self.out.len() {
                let n = ready!(Pin::new(&mut *sink).poll_write(cx, &self.out[self.written..]))
                    .map_err(PipeError::Sink)?;
                if n == 0 {
                    return Poll::Ready(Err(PipeError::Sink(io::ErrorKind::WriteZero.into())));
                }
                self.written += n;
                self.progress += n as u64;
            }
            if self.ended {
                // `out` stays as written (see `into_sent`).
                ready!(Pin::new(&mut *sink).poll_flush(cx)).map_err(PipeError::Sink)?;
                self.flushed = true;
                return Poll::Ready(Ok(()));
            }
            self.out.clear();
            self.written = 0;
            if !buf.is_empty() {
                continue;
            }
            self.blocked_on_sink = false;
            let n = ready!(buf.poll_fill(cx, source)).map_err(PipeError::Source)?;
            self.progress += n as u64;
            if n == 0 {
                if self.decoder != Decoder::Eof {
                    return Poll::Ready(Err(PipeError::Source(
                        io::ErrorKind::UnexpectedEof.into(),
                    )));
                }
                self.decoder = Decoder::Done;
                self.encoding.finish(&mut self.out);
                self.ended = true;
            }
        }
    }

    /// Decodes what `buf` holds into `out`, up to [`OUT_TARGET`].
    fn decode(&mut self, buf: &mut ReadBuf) -> io::Result<()> {
        while !self.ended && !buf.is_empty() && self.out.len() < OUT_TARGET {
            let (used, data) = self
                .decoder
                .decode(buf.data())
                .map_err(|Malformed(why)| io::Error::new(io::ErrorKind::InvalidData, why))?;
            if let Some(range) = data {
                self.moved += range.len() as u64;
                self.encoding.encode(&buf.data()[range], &mut self.out);
            }
            buf.consume(used);
            if self.decoder.is_done() {
                self.encoding.finish(&mut self.out);
                self.ended = true;
            }
            if used == 0 {
                break;
            }
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) async fn run<R, W>(
        &mut self,
        source: &mut R,
        buf: &mut ReadBuf,
        sink: &mut W,
    ) -> Result<(), PipeError>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        std::future::poll_fn(|cx| self.poll_run(cx, source, buf, sink)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `step` bytes; returns the body.
    fn decode_all(
        framing: Framing,
        input: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, usize), Malformed> {
        let mut d = Decoder::new(framing);
        let mut out = Vec::new();
        let mut pos = 0;
        let mut fed = 0;
        while !d.is_done() && fed < input.len() {
            fed = (fed + step).min(input.len());
            loop {
                let (used, data) = d.decode(&input[pos..fed])?;
                if let Some(r) = data {
                    out.extend_from_slice(&input[pos..fed][r]);
                }
                pos += used;
                if used == 0 || d.is_done() {
                    break;
                }
            }
        }
        assert!(
            d.is_done() || framing == Framing::Eof,
            "not done after {input:?}"
        );
        Ok((out, pos))
    }

    #[test]
    fn chunked_decoding_in_every_split() {
        let wire =
            b"5\r\nhello\r\n1;ext=\"x\"\r\n \r\nA \r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\nNEXT";
        for step in 1..=wire.len() {
            let (body, used) = decode_all(Framing::Chunked, wire, step).unwrap();
            assert_eq!(body, b"hello 0123456789", "step {step}");
            assert_eq!(&wire[used..], b"NEXT", "stops at the end of the body");
        }
    }

    #[test]
    fn chunked_rejects_malformed_framing() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"g\r\n",
            b"\r\n",
            b"11111111111111111\r\n",
            b"5;a\nb\r\nhello\r\n",
            b"0\r\nX: 1\n\r\n",
        ] {
            assert!(
                decode_all(Framing::Chunked, bad, bad.len()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn length_and_eof() {
        let (body, used) = decode_all(Framing::Length(3), b"abcdef", 2).unwrap();
        assert_eq!((body.as_slice(), used), (&b"abc"[..], 3));
        let mut d = Decoder::new(Framing::Eof);
        assert_eq!(d.decode(b"xy").unwrap(), (2, Some(0..2)));
        assert!(Decoder::new(Framing::Length(0)).is_done());
    }

    #[test]
    fn chunked_encoding() {
        let mut out = Vec::new();
        Encoding::Chunked.encode(&[1u8; 300], &mut out);
        assert!(out.starts_with(b"12c\r\n"));
        Encoding::Chunked.finish(&mut out);
        assert!(out.ends_with(b"\r\n0\r\n\r\n"));
    }

    #[tokio::test]
    async fn pipe_reencodes_and_stops_at_the_body_end() {
        let mut src: &[u8] = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nGET /next";
        let mut buf = ReadBuf::new(4);
        let mut sink = Vec::new();
        let mut pipe = Pipe::new(b"HEAD".to_vec());
        pipe.start(Framing::Chunked, Encoding::Identity);
        pipe.run(&mut src, &mut buf, &mut sink).await.unwrap();
        assert_eq!(sink, b"HEADabcde");
        assert_eq!(pipe.moved, 5);
        assert!(pipe.finished());
        // What follows the body stays for the next message.
        let mut rest = buf.data().to_vec();
        rest.extend_from_slice(src);
        assert_eq!(rest, b"GET /next");

        let mut src: &[u8] = b"hello world";
        let mut buf = ReadBuf::new(4);
        let mut sink = Vec::new();
        let mut pipe = Pipe::new(Vec::new());
        pipe.start(Framing::Eof, Encoding::Chunked);
        pipe.run(&mut src, &mut buf, &mut sink).await.unwrap();
        let text = String::from_utf8(sink).unwrap();
        assert!(text.ends_with("0\r\n\r\n"), "{text:?}");
        assert_eq!(text.matches("\r\n").count() % 2, 0);

        let mut src: &[u8] = b"ab";
        let mut pipe = Pipe::new(Vec::new());
        pipe.start(Framing::Length(5), Encoding::Identity);
        let err = pipe
            .run(&mut src, &mut ReadBuf::new(8), &mut Vec::new())
            .await
            .unwrap_err();
        assert!(matches!(err, PipeError::Source(e) if e.kind() == io::ErrorKind::UnexpectedEof));
    }
}
