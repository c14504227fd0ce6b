//! The connections of slotgate's HTTP listeners (the console, and the
//! `/metrics` and health endpoints): how many may be open, how long a
//! client has to send its request head, how long the server waits for a
//! client that stopped reading, and how they all end on shutdown. Both
//! listeners serve with `axum` through [`GuardedListener`], so a stranger
//! who can reach either port meets the same limits.
//!
//! Why here, at the socket, rather than in hyper or a tower layer:
//! `axum::serve` gives hyper no timer, so hyper's own `header_read_timeout`
//! is off, and turning it on means replacing `axum::serve` with a
//! hand-written hyper-util accept loop (and depending on hyper and
//! hyper-util directly). A tower layer such as `tower_http`'s
//! `TimeoutLayer` only starts once hyper has parsed a whole request head, so
//! it can never see a half-sent one. Wrapping the accepted socket (the
//! `axum::serve::Listener` seam) sees every byte, keeps `axum::serve` and
//! its graceful shutdown, and adds no dependency.
//!
//! Each response carries `Connection: close` (each listener sets it), so a
//! connection serves one request and the head deadline, counted from the
//! accept, covers all of it: a keep-alive connection never sits idle
//! waiting for a next head. The request's handling (including reading a
//! body) has its own deadline in the middleware.

use axum::serve::Listener;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// A client has this long from its connection to the end of its request
/// head (the blank line after the headers). A browser or curl sends it in
/// one packet; 10 s is generous for a slow link and short enough that a
/// client holding connections open with half a request frees them quickly.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that stops reading its response (its socket buffer full) is
/// dropped after this long without progress. An event stream sends a
/// keep-alive every 15 s, so a live page never comes near it.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The listener's limits and the two stages of shutdown.
#[derive(Clone)]
pub struct Limits {
    /// The listener's name in logs (`console`, `health`).
    pub name: &'static str,
    /// What sets the cap, named in the refusal (`--max-connections`), or
    /// empty when nothing does.
    pub cap_set_by: &'static str,
    /// Connections open at once (the console's `--max-connections`).
    pub max_connections: usize,
    /// Shutdown began: connections that have not sent a whole request head
    /// yet are closed at once (they have no request to finish).
    pub stop: CancellationToken,
    /// The grace after shutdown ran out: every connection is closed.
    pub hard: CancellationToken,
}

/// A `TcpListener` that caps open connections and hands out [`Guarded`]
/// sockets.
pub struct GuardedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    limits: Limits,
}

impl GuardedListener {
    /// Wraps `inner`, refusing connections beyond `limits`.
    pub fn new(inner: TcpListener, limits: Limits) -> Self {
        GuardedListener {
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            inner,
            limits,
        }
    }
}

impl Listener for GuardedListener {
    type Io = Guarded;
    type Addr = SocketAddr;

    /// Accepts until a connection fits under the cap; one over it is
    /// answered 503 and closed (by a task of its own, bounded in time).
    /// `axum::serve` drops this future when shutdown begins, which is how
    /// the loop ends.
    async fn accept(&mut self) -> (Guarded, SocketAddr) {
        loop {
            let (sock, addr) = match self.inner.accept().await {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(listener = self.limits.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => return (Guarded::new(sock, permit, &self.limits), addr),
                Err(_) => {
                    let l = &self.limits;
                    tokio::spawn(refuse(sock, l.name, l.max_connections, l.cap_set_by));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// The answer to a connection over the cap.
async fn refuse(mut sock: TcpStream, name: &'static str, cap: usize, set_by: &'static str) {
    tracing::warn!(listener = name, cap, "connection refused, too many open");
    let set_by = if set_by.is_empty() {
        String::new()
    } else {
        format!(", {set_by}")
    };
    let body = format!("{{\"error\":\"too many connections open (the cap is {cap}{set_by})\"}}");
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        sock.write_all(resp.as_bytes()).await?;
        sock.shutdown().await
    })
    .await;
}

/// An accepted socket under the deadlines above; holds its place under the
/// connection cap until dropped.
pub struct Guarded {
    sock: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Running until the request head has been read whole.
    head_deadline: Option<Pin<Box<Sleep>>>,
    /// The head scan: a byte other than CR/LF was seen, and the last one
    /// seen (CR aside) was a LF.
    seen_text: bool,
    after_lf: bool,
    /// Running while a write is blocked on a client that does not read.
    write_stall: Option<Pin<Box<Sleep>>>,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    hard: Pin<Box<WaitForCancellationFutureOwned>>,
    name: &'static str,
}

impl Guarded {
    fn new(sock: TcpStream, permit: OwnedSemaphorePermit, limits: &Limits) -> Self {
        Guarded {
            sock,
            _permit: permit,
            head_deadline: Some(Box::pin(tokio::time::sleep(HEADER_READ_TIMEOUT))),
            seen_text: false,
            after_lf: false,
            write_stall: None,
            stop: Box::pin(limits.stop.clone().cancelled_owned()),
            hard: Box::pin(limits.hard.clone().cancelled_owned()),
            name: limits.name,
        }
    }

    /// Feeds received bytes to the head scan; true once the blank line that
    /// ends the head has arrived. Blank lines before the request line do
    /// not count (RFC 9112 lets a server skip them), so a client cannot
    /// dodge the deadline by sending only line breaks.
    fn scan(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            match b {
                b'\r' => {}
                b'\n' if self.seen_text && self.after_lf => return true,
                b'\n' => self.after_lf = true,
                _ => {
                    self.seen_text = true;
                    self.after_lf = false;
                }
            }
        }
        false
    }

    fn closed(why: &'static str) -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionAborted, why)
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.hard.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Self::closed("listener shutting down")));
        }
        if this.head_deadline.is_some() && this.stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Self::closed(
                "listener shutting down before a whole request arrived",
            )));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.sock).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.head_deadline.is_some() {
                    let got = buf.filled()[before..].to_vec();
                    if this.scan(&got) {
                        this.head_deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let expired = this
                    .head_deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if !expired {
                    return Poll::Pending;
                }
                tracing::info!(
                    listener = this.name,
                    timeout = ?HEADER_READ_TIMEOUT,
                    "closing a connection that sent no whole request head in time"
                );
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no whole request head within the header read timeout",
                )))
            }
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.hard.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Self::closed("listener shutting down")));
        }
        match Pin::new(&mut this.sock).poll_write(cx, data) {
            Poll::Pending => {
                let stall = this
                    .write_stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL_TIMEOUT)));
                if stall.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    )));
                }
                Poll::Pending
            }
            ready => {
                this.write_stall = None;
                ready
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.hard.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Self::closed("listener shutting down")));
        }
        Pin::new(&mut self.sock).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.sock).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn guarded() -> Guarded {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        std::mem::forget(c);
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let limits = Limits {
            name: "test",
            cap_set_by: "",
            max_connections: 1,
            stop: CancellationToken::new(),
            hard: CancellationToken::new(),
        };
        Guarded::new(s, permit, &limits)
    }

    #[tokio::test]
    async fn the_head_ends_at_the_first_blank_line_after_text() {
        let mut g = guarded().await;
        assert!(!g.scan(b"\r\n\r\n"), "leading blank lines are not a head");
        assert!(!g.scan(b"GET / HTTP/1.1\r\nhost: x\r"));
        assert!(g.scan(b"\n\r\n"));
        let mut g = guarded().await;
        assert!(g.scan(b"GET / HTTP/1.1\nhost: x\n\n"));
    }
}
