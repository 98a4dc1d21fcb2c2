//! A TCP stream that bounds how long a client may take over a request: the HTTP listeners wrap
//! every accepted connection in [`GuardedStream`].
//!
//! Why: actix-http times only the first request's head (`client_request_timeout`). Once a
//! keep-alive connection has been answered, the next request's head, and every request's body,
//! may arrive one byte a minute, and a few hundred such clients hold the server's connections and
//! file descriptors for as long as they like (slowloris).
//!
//! Guarantee: from the first byte of a request until the first byte of its answer at most
//! `limit` passes; past it, the connection is closed. The stream knows nothing of HTTP: a request
//! starts with the first byte read while the connection is idle (just opened, or answered), and
//! ends when an answer is written. `limit` must therefore cover reading the request and producing
//! the answer (for the tracking API: its request timeout plus its Kafka acknowledgement timeout).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A stream whose requests must be answered within a time limit.
pub struct GuardedStream<T> {
    inner: T,
    limit: Duration,
    /// Armed by the first byte of a request; cleared by its answer.
    deadline: Option<Pin<Box<Sleep>>>,
    /// No request is being read or answered.
    idle: bool,
}

impl<T> GuardedStream<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            deadline: None,
            idle: true,
        }
    }

    /// Errs once the request under way is past its deadline. Polling the timer also registers
    /// the task's waker, so the connection is woken, and closed, even if the client sends nothing.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let expired = self
            .deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if expired {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the request was not received and answered within {:?}",
                    self.limit
                ),
            ));
        }
        Ok(())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for GuardedStream<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.check_deadline(cx)?;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before && this.idle {
            this.idle = false;
            this.deadline = Some(Box::pin(tokio::time::sleep(this.limit)));
            this.check_deadline(cx)?;
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GuardedStream<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            // An answer is being written: the request is over.
            this.idle = true;
            this.deadline = None;
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.idle = true;
            this.deadline = None;
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_request_that_is_not_answered_in_time_fails_the_stream() {
        let (client, server) = tokio::io::duplex(64);
        let mut server = GuardedStream::new(server, Duration::from_secs(5));
        let mut client = client;
        let mut buf = [0u8; 16];

        // Idle: no deadline, however long the wait.
        tokio::time::sleep(Duration::from_secs(60)).await;
        client.write_all(b"GET").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 3);

        // The first byte armed the deadline: a trickle that never completes is cut off.
        client.write_all(b" /").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 2);
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_ends_the_request_and_the_next_one_gets_its_own_time() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut server = GuardedStream::new(server, Duration::from_secs(5));
        let mut buf = [0u8; 16];
        for _ in 0..3 {
            client.write_all(b"request").await.unwrap();
            server.read_exact(&mut buf[..7]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
            server.write_all(b"answer").await.unwrap();
            client.read_exact(&mut buf[..6]).await.unwrap();
            // Idle between requests for longer than the limit: that is keep-alive's business.
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    }
}
