//! A TCP proxy a test controls, for a server connection that goes silent:
//! [`Proxy::freeze`] keeps accepting connections but forwards nothing in
//! either direction (on old and new connections alike), the way a server
//! behind a dead link or a hung load balancer looks from the client: no
//! error, no reset, no answer. [`Proxy::thaw`] forwards again, holding back
//! nothing that was sent while frozen. [`Proxy::repoint`] moves the
//! address to another server, the way a virtual IP or a DNS name follows a
//! failover: connections through it are closed, new ones reach the new
//! server. The shared servers are never touched: only the client's way to
//! them is.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy on 127.0.0.1; everything stops when it is dropped.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    accepted: Arc<AtomicUsize>,
    /// `host:port` new connections are forwarded to.
    upstream: Arc<Mutex<String>>,
    /// The accept loop.
    accept: JoinHandle<()>,
    /// One per client connection.
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`) on a free loopback port.
    /// Needs a tokio runtime (its tasks run on the caller's).
    pub async fn start(upstream: &str) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (frozen, _) = watch::channel(false);
        let accepted = Arc::new(AtomicUsize::new(0));
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let upstream = Arc::new(Mutex::new(upstream.to_owned()));
        let (rx, count, list, to) = (
            frozen.subscribe(),
            accepted.clone(),
            tasks.clone(),
            upstream.clone(),
        );
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                // Held until the task is listed, so a repoint either sees
                // it (and cuts it) or came first (and it goes to the new
                // server).
                let target = to.lock().expect("proxy upstream");
                let t = tokio::spawn(forward(client, target.clone(), rx.clone()));
                let mut list = list.lock().expect("proxy tasks");
                list.retain(|t| !t.is_finished());
                list.push(t);
            }
        });
        Ok(Proxy {
            addr,
            frozen,
            accepted,
            upstream,
            accept,
            tasks,
        })
    }

    /// Starts a proxy to the server of `url` (`scheme://[user@]host:port/...`)
    /// and returns it with `url` rewritten to go through it.
    pub async fn for_url(url: &str) -> std::io::Result<(Proxy, String)> {
        let (before, host_port, after) = split_authority(url);
        let proxy = Proxy::start(host_port).await?;
        let through = format!("{before}{}{after}", proxy.addr);
        Ok((proxy, through))
    }

    /// Stops forwarding: connections are still accepted, bytes are held.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again, starting with what was held.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Forwards new connections to `upstream` (`host:port`) from now on and
    /// closes every connection made so far, as a virtual IP that moved to
    /// another server would: a client sees its connections end and reaches
    /// the new server by reconnecting to the same address.
    pub fn repoint(&self, upstream: &str) {
        let mut to = self.upstream.lock().expect("proxy upstream");
        *to = upstream.to_owned();
        self.cut();
    }

    /// Closes every connection made so far (new ones are still accepted).
    pub fn cut(&self) {
        for t in self.tasks.lock().expect("proxy tasks").drain(..) {
            t.abort();
        }
    }

    /// Where new connections go (`host:port`).
    pub fn upstream(&self) -> String {
        self.upstream.lock().expect("proxy upstream").clone()
    }

    /// How many client connections it has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// `url` as (everything up to the host, `host:port`, the rest).
fn split_authority(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map(|i| i + 3).unwrap_or(0);
    let end = url[start..]
        .find(['/', '?'])
        .map(|i| start + i)
        .unwrap_or(url.len());
    let host_start = url[start..end]
        .rfind('@')
        .map(|i| start + i + 1)
        .unwrap_or(start);
    (&url[..host_start], &url[host_start..end], &url[end..])
}

async fn thawed(rx: &mut watch::Receiver<bool>) -> bool {
    rx.wait_for(|frozen| !*frozen).await.is_ok()
}

/// One client: connects upstream once thawed, then pipes both ways.
async fn forward(client: TcpStream, upstream: String, mut rx: watch::Receiver<bool>) {
    if !thawed(&mut rx).await {
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::join!(pipe(cr, sw, rx.clone()), pipe(sr, cw, rx));
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut rx: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !thawed(&mut rx).await {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Frozen while the read was pending: hold the bytes until thawed.
        if !thawed(&mut rx).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::split_authority;

    #[test]
    fn the_authority_is_found_with_and_without_a_user() {
        assert_eq!(
            split_authority("postgres://root@127.0.0.1:5432/sg_1?sslmode=disable"),
            (
                "postgres://root@",
                "127.0.0.1:5432",
                "/sg_1?sslmode=disable"
            )
        );
        assert_eq!(
            split_authority("redis://127.0.0.1:6379"),
            ("redis://", "127.0.0.1:6379", "")
        );
    }
}
