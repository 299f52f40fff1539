//! The read buffer of one side of a proxied HTTP/1 exchange.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::AsyncRead;

/// Bytes read from a socket and not consumed yet: `buf[start..end]`. Initialised memory (zeroed
/// once) so that reads need no `unsafe`; reused for the whole life of the connection.
#[derive(Debug)]
pub(crate) struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    pub(crate) fn new(capacity: usize) -> Self {
        ReadBuf {
            buf: vec![0; capacity],
            start: 0,
            end: 0,
        }
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Whether the unread bytes fill the whole buffer (a head that does not fit yet).
    pub(crate) fn is_full(&self) -> bool {
        self.start == 0 && self.end == self.buf.len()
    }

    /// Grows the buffer to `capacity` bytes (never shrinks).
    pub(crate) fn grow_to(&mut self, capacity: usize) {
        if capacity > self.buf.len() {
            self.buf.resize(capacity, 0);
        }
    }

    /// Reads once from `io` into the free space, moving unread bytes to the front first when
    /// the tail is short. `Ready(Ok(0))` is end of stream, or a full buffer (callers check
    /// [`ReadBuf::is_full`] before reading).
    pub(crate) fn poll_fill<R: AsyncRead + Unpin + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut R,
    ) -> Poll<io::Result<usize>> {
        if self.end == self.buf.len() && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let mut rb = tokio::io::ReadBuf::new(&mut self.buf[self.end..]);
        ready!(Pin::new(io).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        self.end += n;
        Poll::Ready(Ok(n))
    }

    #[cfg(test)]
    pub(crate) async fn fill<R: AsyncRead + Unpin + ?Sized>(
        &mut self,
        io: &mut R,
    ) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx, io)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fill_consume_compact() {
        let mut b = ReadBuf::new(8);
        let mut src: &[u8] = b"abcdefghij";
        assert_eq!(b.fill(&mut src).await.unwrap(), 8);
        assert!(b.is_full());
        b.consume(6);
        assert_eq!(b.data(), b"gh");
        // The tail is full: the unread bytes move to the front before the next read.
        assert_eq!(b.fill(&mut src).await.unwrap(), 2);
        assert_eq!(b.data(), b"ghij");
        b.consume(4);
        assert!(b.is_empty());
        let mut src: &[u8] = b"xyz";
        let mut b = ReadBuf::new(2);
        b.fill(&mut src).await.unwrap();
        b.grow_to(16);
        assert_eq!(b.capacity(), 16);
        b.fill(&mut src).await.unwrap();
        assert_eq!(b.data(), b"xyz");
    }
}
