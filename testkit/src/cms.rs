//! A stand-in CMS: a real HTTP server on 127.0.0.1 that records every call
//! (path, Idempotency-Key, body) and answers from a per-path script of
//! faults, then applies each key's effect once, as a CMS honouring
//! idempotency keys would.
//!
//! When a path's script is empty, an optional [`Chooser`] (set with
//! [`Cms::set_chooser`]) picks the answer instead of the default 200: the
//! chaos suite uses it for seeded random faults and to hold a call open.

use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answer with this status (2xx applies the effect).
    Status(u16),
    /// Wait this long, then answer 200 (a timeout when longer than the
    /// client's).
    Delay(Duration, u16),
    /// Close the connection without answering.
    Reset,
    /// Answer with this status and these extra headers (e.g. a 301 with a
    /// `location`); 2xx applies the effect.
    StatusWith(u16, Vec<(String, String)>),
    /// Hold the call open until the test calls `notify_one` on the handle,
    /// then answer with this status: lets a test act at the exact moment
    /// between the CMS receiving a call and answering it.
    Hold(std::sync::Arc<tokio::sync::Notify>, u16),
    /// Answer with this 3xx status and a `Location` header (relative to the
    /// server, e.g. `/moved`), no effect. A client that follows it re-sends
    /// the call as a GET to that path, where it is recorded as a call too.
    Redirect(u16, String),
    /// Answer 200 (applying the effect) with a JSON body of about this many
    /// bytes: `{"url": …, "pad": "xxxx…"}`.
    Oversized(usize),
}

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Call {
    pub path: String,
    pub key: Option<String>,
    pub body: Value,
    /// The status it was (or will be) answered with; `None` for a reset.
    pub status: Option<u16>,
    /// When it arrived (wall clock).
    pub at: SystemTime,
    /// When the answer was written (or the connection reset); `None` while
    /// a delayed answer is still pending.
    pub answered_at: Option<SystemTime>,
}

impl Call {
    /// Whether the CMS applied it: answered with a 2xx (whether or not the
    /// client was still waiting for the answer).
    pub fn applied(&self) -> bool {
        self.answered_at.is_some() && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// Picks the answer to a call whose path has no scripted reply left:
/// `(path, Idempotency-Key, body)`; `None` answers 200. Called on arrival,
/// outside the server's lock.
pub type Chooser = Arc<dyn Fn(&str, Option<&str>, &Value) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    script: HashMap<String, VecDeque<Reply>>,
    /// Applied effects: idempotency key → draft id.
    applied: HashMap<String, Value>,
    chooser: Option<Chooser>,
}

/// The running server.
#[derive(Clone)]
pub struct Cms {
    pub base: String,
    state: Arc<Mutex<State>>,
    in_flight: Arc<AtomicUsize>,
}

impl Cms {
    pub async fn start() -> Cms {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State::default()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (st, fl) = (state.clone(), in_flight.clone());
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let (st, fl) = (st.clone(), fl.clone());
                tokio::spawn(async move {
                    let _ = serve(sock, st, fl).await;
                });
            }
        });
        Cms {
            base,
            state,
            in_flight,
        }
    }

    /// Sets (or with `None` removes) the chooser consulted when a path's
    /// script is empty.
    pub fn set_chooser(&self, chooser: Option<Chooser>) {
        self.state.lock().unwrap().chooser = chooser;
    }

    /// Calls received and not yet answered (e.g. delayed answers).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Queues answers for the next calls to `path`; afterwards calls get 200.
    pub fn script(&self, path: &str, replies: impl IntoIterator<Item = Reply>) {
        self.state
            .lock()
            .unwrap()
            .script
            .entry(path.to_owned())
            .or_default()
            .extend(replies);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn calls_to(&self, path: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.path == path)
            .collect()
    }

    /// Effects applied (successful first calls per key) on `path`.
    pub fn applied(&self, path: &str) -> HashMap<String, Value> {
        let prefix = format!("{path} ");
        self.state
            .lock()
            .unwrap()
            .applied
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&prefix).map(|k| (k.to_owned(), v.clone())))
            .collect()
    }
}

/// Counts a call as in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(n: &Arc<AtomicUsize>) -> InFlight {
        n.fetch_add(1, Ordering::SeqCst);
        InFlight(n.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve(
    mut sock: tokio::net::TcpStream,
    st: Arc<Mutex<State>>,
    in_flight: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    loop {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = sock.read(&mut tmp).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let path = lines
            .next()
            .unwrap_or("")
            .split(' ')
            .nth(1)
            .unwrap_or("/")
            .to_owned();
        let mut len = 0usize;
        let mut key = None;
        for l in lines {
            if let Some((n, v)) = l.split_once(':') {
                match n.trim().to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap_or(0),
                    "idempotency-key" => key = Some(v.trim().to_owned()),
                    _ => {}
                }
            }
        }
        while buf.len() < head_end + len {
            let n = sock.read(&mut tmp).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        let body: Value =
            serde_json::from_slice(&buf[head_end..head_end + len]).unwrap_or(Value::Null);
        let _in_flight = InFlight::new(&in_flight);
        let (scripted, chooser) = {
            let mut g = st.lock().unwrap();
            let scripted = g.script.get_mut(&path).and_then(|q| q.pop_front());
            (scripted, g.chooser.clone())
        };
        let reply = scripted
            .or_else(|| chooser.and_then(|f| f(&path, key.as_deref(), &body)))
            .unwrap_or(Reply::Status(200));
        // Recorded on arrival: a client that times out still made the call.
        let planned = match &reply {
            Reply::Reset => None,
            Reply::Status(s)
            | Reply::Delay(_, s)
            | Reply::StatusWith(s, _)
            | Reply::Hold(_, s)
            | Reply::Redirect(s, _) => Some(*s),
            Reply::Oversized(_) => Some(200),
        };
        let idx = {
            let mut g = st.lock().unwrap();
            g.calls.push(Call {
                path: path.clone(),
                key: key.clone(),
                body: body.clone(),
                status: planned,
                at: SystemTime::now(),
                answered_at: None,
            });
            g.calls.len() - 1
        };
        let mut headers = Vec::new();
        let mut pad = 0;
        let status = match reply {
            Reply::Reset => {
                st.lock().unwrap().calls[idx].answered_at = Some(SystemTime::now());
                return Ok(());
            }
            Reply::Status(s) => s,
            Reply::StatusWith(s, h) => {
                headers = h;
                s
            }
            Reply::Delay(d, s) => {
                tokio::time::sleep(d).await;
                s
            }
            Reply::Hold(release, s) => {
                release.notified().await;
                s
            }
            Reply::Redirect(s, to) => {
                headers = vec![("location".to_owned(), to)];
                s
            }
            Reply::Oversized(n) => {
                pad = n;
                200
            }
        };
        let mut answer = {
            let mut g = st.lock().unwrap();
            g.calls[idx].answered_at = Some(SystemTime::now());
            if (200..300).contains(&status) {
                let k = format!("{path} {}", key.clone().unwrap_or_default());
                let first = g.applied.entry(k).or_insert_with(|| body.clone()).clone();
                let url = format!(
                    "https://cms.test/{}",
                    first.pointer("/draft/id").cloned().unwrap_or(Value::Null)
                );
                json!({"url": url})
            } else {
                json!({"error": "scripted failure"})
            }
        };
        if pad > 0 {
            answer["pad"] = Value::String("x".repeat(pad));
        }
        let text = answer.to_string();
        let extra: String = headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect();
        let resp = format!("HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{text}", text.len());
        sock.write_all(resp.as_bytes()).await?;
    }
}
