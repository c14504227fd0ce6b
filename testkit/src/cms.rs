//! A stand-in CMS: a real HTTP server on 127.0.0.1 that records every call
//! (path, Idempotency-Key, body) and answers from a per-path script of
//! faults, then applies each key's effect once, as a CMS honouring
//! idempotency keys would.
//!
//! When a path's script is empty, an optional [`Chooser`] (set with
//! [`Cms::set_chooser`]) picks the answer instead of the default 200: the
//! chaos suite uses it for seeded random faults and to hold a call open.
//!
//! A CMS that ignores idempotency keys is what most CMSs are: every 2xx
//! answer to a call is counted in [`Cms::effects`], duplicates included, so
//! a test can see what such a CMS would have done. A `GET` to a path
//! starting with `/probe` with no scripted reply answers like a `probe_url`
//! endpoint: `200 {"url"}` when a call with that `Idempotency-Key` was
//! applied at `/publish`, else `404`.
//!
//! [`Cms::follow_probe_contract`] makes it the CMS docs/receivers.md asks a
//! `probe_url` CMS to be when its writes can be slow: every `POST /publish`
//! is recorded on receipt and applied a set time later (whether or not the
//! client is still waiting, as PHP finishes a request whose client left);
//! a probe answers `409` while its key is received and not yet applied,
//! `200 {"url"}` once applied, `404` for a key never received (or whose
//! request ended without applying). Like most CMSs it does not dedupe the
//! POSTs themselves: a second POST of a key applies a second time.
//!
//! A probe of a key starting with [`CHECK_KEY_PREFIX`] (`planner check`,
//! and every worker at its start, probe a random key so) never takes a
//! path's scripted reply: a test's script is for the slot's own calls, and
//! a worker's start would otherwise take one of them first. The chooser
//! and the default answer it as any probe.
//!
//! [`Reply::Body`] answers with a body of the test's choosing (a soft-404
//! page, `{}`), [`Reply::Echo`] and [`Reply::EchoBody`] with one that
//! echoes the request (headers and body, or the body alone), as some error
//! pages and debugging proxies do.
//!
//! [`Cms::start_tls`] serves the same over HTTPS with a certificate the test
//! made ([`crate::tls::TestCa`]). Every call's headers and raw body bytes are
//! recorded, so a test can check a bearer token and recompute a signature
//! over exactly what arrived.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// How the key of a `probe_url` check starts (`slotgate-check-<hex>`):
/// such a probe takes no scripted reply (see the module doc).
pub const CHECK_KEY_PREFIX: &str = "slotgate-check-";

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
    /// Apply the effect, then close the connection without answering:
    /// "applied, answer lost".
    AppliedThenReset,
    /// Answer with this status, `Content-Type` and body (the effect as
    /// [`Reply::Status`] of that status has it).
    Body(u16, String, String),
    /// Answer with this status and a JSON body echoing the request:
    /// `{"error", "method", "path", "headers": {name: value}, "body": raw}`
    /// (a 2xx applies the effect), as a debugging proxy may.
    Echo(u16),
    /// Answer with this status and a JSON body quoting the request's body:
    /// `{"error": "invalid request", "request": <the body as sent>}` (a 2xx
    /// applies the effect), as an API that names what it refused may.
    EchoBody(u16),
}

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Call {
    /// The path called (`/publish`, `/index`, ...).
    pub path: String,
    /// The `Idempotency-Key` header, if one was sent.
    pub key: Option<String>,
    /// The JSON body sent.
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

/// One call as it arrived on the wire (recorded beside its [`Call`], in the
/// same order).
#[derive(Debug, Clone)]
pub struct Request {
    /// The path requested.
    pub path: String,
    /// Every header line as received (names lower-cased).
    pub headers: Vec<(String, String)>,
    /// The body bytes as received.
    pub raw: Vec<u8>,
}

impl Request {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Picks the answer to a call whose path has no scripted reply left:
/// `(path, Idempotency-Key, body)`; `None` answers 200. Called on arrival,
/// outside the server's lock.
pub type Chooser = Arc<dyn Fn(&str, Option<&str>, &Value) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    requests: Vec<Request>,
    script: HashMap<String, VecDeque<Reply>>,
    /// Applied effects: idempotency key → draft id.
    applied: HashMap<String, Value>,
    /// Every 2xx call in order, `(path, key)`: what a CMS that ignores
    /// idempotency keys would have applied.
    effects: Vec<(String, Option<String>)>,
    chooser: Option<Chooser>,
    /// [`Cms::follow_probe_contract`]'s delay, when set.
    apply_after: Option<Duration>,
    /// Keys whose `POST /publish` arrived and has not ended without
    /// applying, as `applied` keys them.
    received: std::collections::HashSet<String>,
}

/// The running server.
#[derive(Clone)]
pub struct Cms {
    /// `http://127.0.0.1:<port>`, where the CMS listens.
    pub base: String,
    state: Arc<Mutex<State>>,
    in_flight: Arc<AtomicUsize>,
}

impl Cms {
    /// Starts the CMS over plain HTTP on a free port of 127.0.0.1.
    pub async fn start() -> Cms {
        Self::start_with(None).await
    }

    /// The same over HTTPS (`https://127.0.0.1:<port>`) with this PEM
    /// certificate chain and key.
    pub async fn start_tls(cert: &Path, key: &Path) -> Cms {
        let certs = CertificateDer::pem_file_iter(cert)
            .expect("certificate file")
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM");
        let key = PrivateKeyDer::from_pem_file(key).expect("key PEM");
        let config = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server certificate");
        Self::start_with(Some(TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<TlsAcceptor>) -> Cms {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let base = match tls {
            None => format!("http://127.0.0.1:{port}"),
            Some(_) => format!("https://127.0.0.1:{port}"),
        };
        let state = Arc::new(Mutex::new(State::default()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (st, fl) = (state.clone(), in_flight.clone());
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let (st, fl, tls) = (st.clone(), fl.clone(), tls.clone());
                tokio::spawn(async move {
                    let _ = match tls {
                        None => serve(sock, st, fl).await,
                        Some(tls) => match tls.accept(sock).await {
                            Ok(s) => serve(s, st, fl).await,
                            // A client that refused our certificate.
                            Err(e) => Err(e),
                        },
                    };
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

    /// Follows the `probe_url` contract of docs/receivers.md for slow
    /// writes: a `POST /publish` with no scripted or chosen reply is
    /// recorded on receipt and applied (and answered 200) `apply_after`
    /// later; a probe answers `409` while its key is received and not yet
    /// applied, `200 {"url"}` once applied, `404` for a key never
    /// received. POSTs are not deduplicated: each one that applies counts
    /// in [`Cms::effects`].
    pub fn follow_probe_contract(&self, apply_after: Duration) {
        self.state.lock().unwrap().apply_after = Some(apply_after);
    }

    /// Calls received and not yet answered (e.g. delayed answers).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The full URL of `path` on this CMS, for a kind's config.
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

    /// Every call so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Every call's headers and raw body, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The calls to `path`, in arrival order.
    pub fn calls_to(&self, path: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.path == path)
            .collect()
    }

    /// The calls to `path` other than checks (a key starting with
    /// [`CHECK_KEY_PREFIX`]): a slot's own probes, without the one each
    /// worker sends at its start.
    pub fn slot_calls_to(&self, path: &str) -> Vec<Call> {
        self.calls_to(path)
            .into_iter()
            .filter(|c| !c.key.as_deref().unwrap_or("").starts_with(CHECK_KEY_PREFIX))
            .collect()
    }

    /// How many effects a CMS that ignores idempotency keys would have
    /// applied on `path`: every 2xx call (and every applied-then-reset).
    pub fn effects(&self, path: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .effects
            .iter()
            .filter(|(p, _)| p == path)
            .count()
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

/// Answers the requests of one connection, in order, until it closes:
/// each is read, given its reply (scripted, chosen, or the default),
/// recorded on arrival, then answered as the reply says.
async fn serve(
    mut sock: impl AsyncRead + AsyncWrite + Unpin,
    st: Arc<Mutex<State>>,
    in_flight: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    while let Some(req) = Incoming::read(&mut sock).await? {
        let _in_flight = InFlight::new(&in_flight);
        let reply = req.reply(&st);
        let idx = req.record(&st, &reply);
        let mut headers = Vec::new();
        let mut pad = 0;
        let mut body: Option<(String, String)> = None;
        let status = match reply {
            Reply::Reset => {
                let mut g = st.lock().unwrap();
                g.calls[idx].answered_at = Some(SystemTime::now());
                req.forget_unless_applied(&mut g);
                return Ok(());
            }
            Reply::AppliedThenReset => {
                let mut g = st.lock().unwrap();
                g.calls[idx].answered_at = Some(SystemTime::now());
                g.applied
                    .entry(req.applied_key(&req.path))
                    .or_insert_with(|| req.body.clone());
                g.effects.push((req.path.clone(), req.key.clone()));
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
            Reply::Body(s, content_type, text) => {
                body = Some((content_type, text));
                s
            }
            Reply::Echo(s) => {
                body = Some(("application/json".to_owned(), req.echo()));
                s
            }
            Reply::EchoBody(s) => {
                let request = serde_json::from_slice::<Value>(&req.raw)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&req.raw).into()));
                let text = json!({"error": "invalid request", "request": request}).to_string();
                body = Some(("application/json".to_owned(), text));
                s
            }
        };
        let mut answer = req.answer(&st, idx, status);
        if pad > 0 {
            answer["pad"] = Value::String("x".repeat(pad));
        }
        let (content_type, text) =
            body.unwrap_or_else(|| ("application/json".to_owned(), answer.to_string()));
        let extra: String = headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect();
        let resp = format!("HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n{extra}content-length: {}\r\n\r\n{text}", text.len());
        sock.write_all(resp.as_bytes()).await?;
    }
    Ok(())
}

/// One request as read off the connection.
struct Incoming {
    method: String,
    path: String,
    /// The `Idempotency-Key` header.
    key: Option<String>,
    headers: Vec<(String, String)>,
    raw: Vec<u8>,
    /// The body as JSON (`null` when it is not).
    body: Value,
}

impl Incoming {
    /// The next request (head, then `content-length` bytes of body);
    /// `None` when the client closed the connection.
    async fn read(sock: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<Incoming>> {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = sock.read(&mut tmp).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or("");
        let method = request_line.split(' ').next().unwrap_or("").to_owned();
        let path = request_line.split(' ').nth(1).unwrap_or("/").to_owned();
        let mut len = 0usize;
        let mut key = None;
        let mut headers = Vec::new();
        for l in lines {
            if let Some((n, v)) = l.split_once(':') {
                let n = n.trim().to_ascii_lowercase();
                match n.as_str() {
                    "content-length" => len = v.trim().parse().unwrap_or(0),
                    "idempotency-key" => key = Some(v.trim().to_owned()),
                    _ => {}
                }
                headers.push((n, v.trim().to_owned()));
            }
        }
        while buf.len() < head_end + len {
            let n = sock.read(&mut tmp).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        let raw = buf[head_end..head_end + len].to_vec();
        let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        Ok(Some(Incoming {
            method,
            path,
            key,
            headers,
            raw,
            body,
        }))
    }

    /// A `GET /probe…`: the read-before-write look-up of a publish.
    fn is_probe(&self) -> bool {
        self.method == "GET" && self.path.starts_with("/probe")
    }

    /// A `POST /publish`: what [`Cms::follow_probe_contract`] records on
    /// receipt and applies later.
    fn is_publish(&self) -> bool {
        self.method == "POST" && self.path == "/publish"
    }

    /// Where what this key applied at `path` is kept.
    fn applied_key(&self, path: &str) -> String {
        format!("{path} {}", self.key.clone().unwrap_or_default())
    }

    /// A publish that ended without applying (a failure answered, the
    /// connection closed): its key is no longer "received", so a probe
    /// answers 404 again, as the contract asks.
    fn forget_unless_applied(&self, g: &mut State) {
        let key = self.applied_key(&self.path);
        if self.is_publish() && !g.applied.contains_key(&key) {
            g.received.remove(&key);
        }
    }

    /// The request as [`Reply::Echo`] answers it, in this order (the
    /// headers first, as they arrived, then the body).
    fn echo(&self) -> String {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(n, v)| format!("{}:{}", json!(n), json!(v)))
            .collect();
        format!(
            r#"{{"error":"bad request","method":{},"path":{},"headers":{{{}}},"body":{}}}"#,
            json!(self.method),
            json!(self.path),
            headers.join(","),
            json!(String::from_utf8_lossy(&self.raw)),
        )
    }

    /// The next scripted reply for the path, else the chooser's, else the
    /// default: a probe answers 200 when the key's publish was applied,
    /// 409 when it was received and not yet applied under
    /// [`Cms::follow_probe_contract`], else 404; a publish under that
    /// contract is applied after its delay; anything else answers 200.
    fn reply(&self, st: &Mutex<State>) -> Reply {
        let check = self.is_probe()
            && self
                .key
                .as_deref()
                .is_some_and(|k| k.starts_with(CHECK_KEY_PREFIX));
        let (scripted, chooser) = {
            let mut g = st.lock().unwrap();
            let scripted = if check {
                None
            } else {
                g.script.get_mut(&self.path).and_then(|q| q.pop_front())
            };
            (scripted, g.chooser.clone())
        };
        scripted
            .or_else(|| chooser.and_then(|f| f(&self.path, self.key.as_deref(), &self.body)))
            .unwrap_or_else(|| {
                let g = st.lock().unwrap();
                let key = self.applied_key("/publish");
                if self.is_probe() {
                    Reply::Status(if g.applied.contains_key(&key) {
                        200
                    } else if g.apply_after.is_some() && g.received.contains(&key) {
                        409
                    } else {
                        404
                    })
                } else if let (Some(d), true) = (g.apply_after, self.is_publish()) {
                    Reply::Delay(d, 200)
                } else {
                    Reply::Status(200)
                }
            })
    }

    /// Records the call and the request on arrival (a client that times
    /// out still made the call), with the status `reply` will give; the
    /// call's index.
    fn record(&self, st: &Mutex<State>, reply: &Reply) -> usize {
        let planned = match reply {
            Reply::Reset | Reply::AppliedThenReset => None,
            Reply::Status(s)
            | Reply::Delay(_, s)
            | Reply::StatusWith(s, _)
            | Reply::Hold(_, s)
            | Reply::Redirect(s, _)
            | Reply::Body(s, _, _)
            | Reply::Echo(s)
            | Reply::EchoBody(s) => Some(*s),
            Reply::Oversized(_) => Some(200),
        };
        let mut g = st.lock().unwrap();
        if self.is_publish() {
            // On receipt, before anything is applied.
            g.received.insert(self.applied_key("/publish"));
        }
        g.calls.push(Call {
            path: self.path.clone(),
            key: self.key.clone(),
            body: self.body.clone(),
            status: planned,
            at: SystemTime::now(),
            answered_at: None,
        });
        g.requests.push(Request {
            path: self.path.clone(),
            headers: self.headers.clone(),
            raw: self.raw.clone(),
        });
        g.calls.len() - 1
    }

    /// The answer's body, as the call `idx` is answered with `status`: a
    /// probe's finds the applied publish's URL; a 2xx applies the body
    /// (the first one of its key is kept) and names its URL; anything
    /// else is a scripted failure.
    fn answer(&self, st: &Mutex<State>, idx: usize, status: u16) -> Value {
        let mut g = st.lock().unwrap();
        g.calls[idx].answered_at = Some(SystemTime::now());
        let url_of = |first: &Value| {
            format!(
                "https://cms.test/{}",
                first.pointer("/draft/id").cloned().unwrap_or(Value::Null)
            )
        };
        if self.is_probe() && status == 200 {
            let first = g
                .applied
                .get(&self.applied_key("/publish"))
                .cloned()
                .unwrap_or(Value::Null);
            json!({"url": url_of(&first)})
        } else if self.is_probe() && status == 409 {
            json!({"title": "A request is outstanding for this Idempotency-Key"})
        } else if (200..300).contains(&status) {
            g.effects.push((self.path.clone(), self.key.clone()));
            let first = g
                .applied
                .entry(self.applied_key(&self.path))
                .or_insert_with(|| self.body.clone())
                .clone();
            json!({"url": url_of(&first)})
        } else {
            self.forget_unless_applied(&mut g);
            json!({"error": "scripted failure"})
        }
    }
}
