//! The webhook receiver: slotgate's own JSON `POST`ed to `publish_url`
//! (and `index_url`), and the HTTP clients every receiver shares ([`Http`]).
//!
//! Every call carries an `Idempotency-Key` derived from the slot (`<slot key>`
//! for publish, `<slot key>:index` for the index push), so a retry, a
//! takeover by another worker, or an operator's `retry` is the *same* request
//! to the CMS. Timeouts, connection errors, 408, 429 and 5xx are retried with
//! full jitter; any other 4xx fails at once.
//!
//! Only a 2xx answer to the POST itself is a publish. Redirects are not
//! followed: a client that follows a 301/302 re-sends the request as a GET,
//! and the 200 the CMS gives that GET would be recorded as a publish the CMS
//! never made. A 3xx therefore fails at once, naming its `Location`.
//!
//! The CMS's answer is untrusted input: at most [`ANSWER_LIMIT`] bytes of it
//! are read, and only its `url` and a short excerpt are kept, with the
//! kind's secrets and anything that looks like a credential hidden (an
//! error page may echo the request: [`untrusted::excerpt`]).
//!
//! With `probe_url`, a publish whose outcome is unknown (a timeout, a
//! reset, a 5xx or 408 after the request went out, a resumed claim) is not
//! sent again until a `GET probe_url` with the same `Idempotency-Key`
//! answers `404` (the CMS never received the key); `200` with a complete
//! JSON body holding a string `url` means it was applied and is recorded
//! as published at that URL without a second send; any other answer — a
//! `409` (received, still being applied), a `200` without such a body (a
//! soft-404 page, `{}`) — is unknown and probed again with backoff, never
//! sent meanwhile; when the attempts run out the slot is
//! `failed/publish_error` saying what the probe answered. Every probe
//! counts as an attempt; after a `409` the next probe waits between half
//! the `retry_cap` and all of it ([`RetryPolicy::in_progress_delay`]), so
//! `n` attempts wait out a write in progress for at least `n · cap / 2`. [`Receiver::check`] (`planner check`) probes a
//! random key and requires `404`.
//! While the primary has no synchronous standby, even a fresh claim is
//! probed before its first send: an asynchronous failover can lose a gate
//! row whose publish was applied, and the slot then looks fresh (measured:
//! `worker/tests/failover.rs`; DESIGN 4.20).
//! Without `probe_url`, a re-send relies on the CMS honouring the key.
//!
//! Authentication is per kind ([`WebhookAuth`]): an optional bearer token
//! (`Authorization: Bearer …`) and an optional HMAC signature of every
//! request (`Slotgate-Signature: t=<unix seconds>,v1=<hex>`, see
//! [`signature`]) computed over the exact bytes sent. TLS is verified
//! against the system roots plus the kind's `ca_file`; one client is built
//! per distinct CA file.

use super::{back_off, Call, Effect, Indexer, Published, Receiver};
use crate::clock::{SharedClock, SystemClock};
use crate::config::{Config, WebhookAuth};
use crate::retry::RetryPolicy;
use crate::secret::Secret;
use crate::untrusted;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use hmac::{Hmac, Mac};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The header carrying the request signature.
pub const SIGNATURE_HEADER: &str = "Slotgate-Signature";

/// `t=<t>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`: the value of
/// [`SIGNATURE_HEADER`]. The timestamp is inside the signed text, so a
/// receiver that rejects old timestamps also rejects replays of old
/// requests.
pub fn signature(secret: &Secret, t: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The most bytes of an answer's body that are read; the rest is never
/// received, so a CMS (or whatever answers at its address) cannot make a
/// worker buffer or store megabytes.
pub const ANSWER_LIMIT: usize = 64 * 1024;

/// One failed try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    /// HTTP status, when the server answered.
    pub status: Option<u16>,
    /// What went wrong, for logs and the `publish_error` detail; the
    /// request's URL is never in it, and a quoted body is truncated.
    pub error: String,
    /// Timeouts, connection errors, 408, 429 and 5xx: the same request may
    /// succeed later. Any other 4xx and every 3xx fail at once.
    pub retryable: bool,
    /// Where a 3xx answer pointed (truncated); never followed.
    pub location: Option<String>,
}

impl CallFailure {
    /// The request may have reached the CMS and been applied although no
    /// 2xx came back: a timeout, a broken connection or body after the
    /// request went out, a 5xx or a 408. A connection never made (refused,
    /// TLS handshake failed) and a 429 applied nothing.
    pub fn may_have_applied(&self) -> bool {
        match self.status {
            None => !self.error.starts_with("connection error"),
            Some(s) => s >= 500 || s == 408,
        }
    }

    pub(crate) fn transport(status: Option<u16>, error: String) -> Self {
        Self {
            status,
            error,
            retryable: true,
            location: None,
        }
    }
}

/// The result of a call with its retries.
#[derive(Debug, Clone, PartialEq)]
pub struct CallReport {
    /// Tries made, the first included (at most the policy's `max_attempts`).
    pub attempts: u32,
    /// The 2xx answer, or the last try's failure.
    pub result: Result<Answer, CallFailure>,
}

/// A 2xx answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The 2xx status the CMS answered with.
    pub status: u16,
    /// The `url` of a JSON answer `{"url": "…"}`.
    pub url: Option<String>,
    /// The answer's text as stored: a short excerpt, the request's secrets
    /// and anything that looks like a credential hidden
    /// ([`untrusted::excerpt`]).
    pub text: String,
    /// The whole body parsed as JSON (`Null` when it is not JSON or was
    /// longer than [`ANSWER_LIMIT`]); never stored as it is.
    pub json: Value,
    /// The body was longer than [`ANSWER_LIMIT`] and was not read to its end.
    pub cut: bool,
}

impl Answer {
    /// What the gate row keeps of the answer: the URL the slot was
    /// published at and the truncated text, never the whole body.
    pub fn stored(&self, url: &str) -> Value {
        let mut v = serde_json::json!({"url": url, "answer": self.text});
        if self.cut {
            v["answer_cut_at"] = ANSWER_LIMIT.into();
        }
        v
    }
}

impl CallReport {
    /// The `publish_error`/`index_error` detail: status, attempts, last
    /// error, and a redirect's `location`.
    pub fn error_detail(&self) -> Option<Value> {
        let Err(f) = &self.result else { return None };
        let mut v =
            serde_json::json!({"status": f.status, "attempts": self.attempts, "error": f.error});
        if let Some(l) = &f.location {
            v["location"] = l.as_str().into();
        }
        Some(v)
    }
}

/// The body of `resp`, read up to [`ANSWER_LIMIT`] bytes; `true` when it
/// was longer (the rest is left unread and the connection dropped).
pub(crate) async fn read_bounded(
    mut resp: reqwest::Response,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = ANSWER_LIMIT - buf.len();
        if chunk.len() > room {
            buf.extend_from_slice(&chunk[..room]);
            return Ok((buf, true));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok((buf, false))
}

/// The HTTP clients; one set per process (they pool connections).
#[derive(Clone)]
pub struct Http {
    /// For kinds without a `ca_file`: the system roots only.
    client: reqwest::Client,
    /// One per distinct `ca_file`: the system roots plus that CA.
    with_ca: Arc<HashMap<PathBuf, reqwest::Client>>,
    /// The `t` of signatures.
    clock: SharedClock,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("ca_files", &self.with_ca.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

/// A client trusting the system roots and `extra`.
fn client(extra: &[reqwest::Certificate]) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .user_agent(concat!("slotgate/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(10))
        // A redirect is not a publish (see the module doc).
        .redirect(reqwest::redirect::Policy::none());
    for c in extra {
        b = b.add_root_certificate(c.clone());
    }
    // The certificates were parsed when the config was loaded.
    b.build().expect("static reqwest configuration")
}

impl Http {
    /// A client trusting the system roots only (kinds with a `ca_file` get
    /// a client of their own on each call; use [`Http::for_config`]).
    pub fn new() -> Self {
        Self {
            client: client(&[]),
            with_ca: Arc::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The clients for every kind of `config`, one per distinct CA file.
    pub fn for_config(config: &Config, clock: SharedClock) -> Self {
        let mut with_ca = HashMap::new();
        for ca in config.kinds.iter().filter_map(|k| k.auth.ca.as_ref()) {
            with_ca
                .entry(ca.path.clone())
                .or_insert_with(|| client(&ca.certs));
        }
        Self {
            client: client(&[]),
            with_ca: Arc::new(with_ca),
            clock,
        }
    }

    /// The client for a kind with `auth`'s CA file (or the system roots).
    pub fn client_for(&self, auth: &WebhookAuth) -> reqwest::Client {
        match &auth.ca {
            None => self.client.clone(),
            Some(ca) => match self.with_ca.get(&ca.path) {
                Some(c) => c.clone(),
                None => client(&ca.certs),
            },
        }
    }

    /// One try: POST `body` to `to`. Its name (`publish`, `index`)
    /// labels the attempt in the metrics. `body` is shared, not copied:
    /// every try of a call hands over the same buffer.
    pub async fn call_once(&self, to: &Endpoint<'_>, body: Bytes) -> Result<Answer, CallFailure> {
        let r = self.try_once(reqwest::Method::POST, to, Some(body)).await;
        attempt_metric(to.name, &r);
        r
    }

    /// One probe: `GET` of `to` (signed over an empty body when the kind
    /// signs), counted under its name (`probe`).
    pub async fn probe_once(&self, to: &Endpoint<'_>) -> Result<Answer, CallFailure> {
        let r = self.try_once(reqwest::Method::GET, to, None).await;
        attempt_metric(to.name, &r);
        r
    }

    async fn try_once(
        &self,
        method: reqwest::Method,
        to: &Endpoint<'_>,
        body: Option<Bytes>,
    ) -> Result<Answer, CallFailure> {
        let Endpoint {
            url,
            key,
            auth,
            timeout,
            ..
        } = *to;
        let mut req = self
            .client_for(auth)
            .request(method, url)
            .timeout(timeout)
            .header("Idempotency-Key", key);
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        let bytes = body.unwrap_or_default();
        if let Some(token) = &auth.bearer {
            req = req.bearer_auth(token.expose());
        }
        if let Some(secret) = &auth.signing_secret {
            let t = self.clock.now().timestamp();
            req = req.header(SIGNATURE_HEADER, signature(secret, t, &bytes));
        }
        // The signed bytes are the bytes sent.
        send_hiding(req.body(bytes), plain_error, &auth.secret_spellings()).await
    }

    /// Calls with retries. The key never changes between tries.
    pub async fn call<R: Rng + Send>(
        &self,
        to: &Endpoint<'_>,
        body: Bytes,
        policy: RetryPolicy,
        rng: &mut R,
    ) -> CallReport {
        retrying(policy, rng, to.url, to.key, || {
            self.call_once(to, body.clone())
        })
        .await
    }
}

/// Where one webhook call goes and how: the name its attempts are counted
/// under (`publish`, `index`, `probe`), the URL, the idempotency key, the
/// kind's authentication and the limit of each try. Built once per call
/// and passed whole, so every try, probe and retry sends the same five.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint<'a> {
    /// The metrics label of the attempts.
    pub name: &'static str,
    /// Where the request goes.
    pub url: &'a str,
    /// The `Idempotency-Key` header.
    pub key: &'a str,
    /// The kind's bearer token, signing secret and CA.
    pub auth: &'a WebhookAuth,
    /// The limit of each try (the kind's `http_timeout`).
    pub timeout: Duration,
}

/// Tries `once` until it succeeds, fails for good, or `policy`'s attempts
/// are spent, sleeping full-jitter backoff between tries; the retry log
/// line names `url` (redacted) and `key`. The plain retry loop of every
/// call that needs no look-up between tries.
pub(crate) async fn retrying<R, F, Fut>(
    policy: RetryPolicy,
    rng: &mut R,
    url: &str,
    key: &str,
    mut once: F,
) -> CallReport
where
    R: Rng + Send + ?Sized,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Answer, CallFailure>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match once().await {
            Err(f) if f.retryable && attempt < policy.max_attempts => {
                let d = policy.delay(rng, attempt - 1);
                let url = crate::secret::redact_url(url);
                tracing::info!(url, key, attempt, error = %f.error, delay_ms = d.as_millis() as u64, "HTTP call failed; retrying");
                tokio::time::sleep(d).await;
            }
            result => {
                return CallReport {
                    attempts: attempt,
                    result,
                }
            }
        }
    }
}

/// Counts one try by endpoint and class of answer.
pub(crate) fn attempt_metric(endpoint: &'static str, r: &Result<Answer, CallFailure>) {
    let class = match r {
        Ok(_) => "2xx",
        Err(CallFailure {
            status: Some(s), ..
        }) if *s >= 500 => "5xx",
        Err(CallFailure {
            status: Some(s), ..
        }) if *s >= 400 => "4xx",
        Err(CallFailure {
            status: Some(s), ..
        }) if *s >= 300 => "3xx",
        Err(f) if f.error.starts_with("timeout") => "timeout",
        Err(_) => "error",
    };
    crate::telemetry::webhook_attempt(endpoint, class);
}

/// Sends `req` and reads its answer: a 2xx is an [`Answer`]; a 3xx is
/// never followed; anything else is a [`CallFailure`] saying whether a
/// retry may help.
pub(crate) async fn send(req: reqwest::RequestBuilder) -> Result<Answer, CallFailure> {
    send_with(req, plain_error).await
}

/// `HTTP <status>: <an excerpt of the body>` (or `(empty body)`): how a
/// refusal reads in `publish_error`. The excerpt is short and has whatever
/// looks like a credential masked ([`untrusted::excerpt`]): an error page
/// may echo the request, its key or `Authorization` header included.
pub(crate) fn plain_error(status: u16, body: &[u8]) -> String {
    let mut snippet = untrusted::excerpt(body, &[]);
    if snippet.is_empty() {
        snippet = "(empty body)".into();
    }
    format!("HTTP {status}: {snippet}")
}

/// [`send`], with a refusal (a non-2xx, non-3xx answer) described by
/// `describe` from its status and its whole body as read (at most
/// [`ANSWER_LIMIT`] bytes), for a CMS whose errors have a shape of their
/// own.
pub(crate) async fn send_with(
    req: reqwest::RequestBuilder,
    describe: fn(u16, &[u8]) -> String,
) -> Result<Answer, CallFailure> {
    send_hiding(req, describe, &[]).await
}

/// [`send_with`], with every spelling of `secrets` (the credentials the
/// request carried: [`crate::config::WebhookAuth::secret_spellings`], the
/// IndexNow key) hidden from the answer before anything of it is kept: the
/// body a refusal is described from, a 2xx answer's stored text, a
/// redirect's `Location`. An answer that echoes the request thus never
/// puts a secret in a log line or a stored detail.
pub(crate) async fn send_hiding(
    req: reqwest::RequestBuilder,
    describe: fn(u16, &[u8]) -> String,
    secrets: &[String],
) -> Result<Answer, CallFailure> {
    let resp = req.send().await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            // The error would name the URL; a query parameter may be a
            // secret. The URL is logged redacted by the caller.
            let e = e.without_url();
            let kind = if e.is_timeout() {
                "timeout"
            } else if e.is_connect() {
                "connection error"
            } else {
                "request error"
            };
            return Err(CallFailure::transport(
                None,
                format!("{kind}: {}", chain(&e)),
            ));
        }
    };
    let status = resp.status().as_u16();
    if (300..400).contains(&status) {
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|l| untrusted::excerpt(l.as_bytes(), secrets));
        return Err(CallFailure {
            status: Some(status),
            error: format!(
                "HTTP {status}: redirect to {} not followed (a redirect is not a publish)",
                location.as_deref().unwrap_or("(no Location)")
            ),
            retryable: false,
            location,
        });
    }
    let (bytes, cut) = match read_bounded(resp).await {
        Ok(b) => b,
        Err(e) => {
            let kind = if e.is_timeout() {
                "timeout reading body"
            } else {
                "error reading body"
            };
            return Err(CallFailure::transport(
                Some(status),
                format!("{kind}: {}", chain(&e)),
            ));
        }
    };
    if (200..300).contains(&status) {
        let json = if cut {
            Value::Null
        } else {
            serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null)
        };
        let url = json.get("url").and_then(Value::as_str).map(str::to_owned);
        return Ok(Answer {
            status,
            url,
            text: untrusted::excerpt(&bytes, secrets),
            json,
            cut,
        });
    }
    let retryable = status == 408 || status == 429 || status >= 500;
    let shown = if secrets.is_empty() {
        bytes
    } else {
        untrusted::scrub(&String::from_utf8_lossy(&bytes), secrets).into_bytes()
    };
    Err(CallFailure {
        status: Some(status),
        error: describe(status, &shown),
        retryable,
        location: None,
    })
}

/// The webhook receiver of a kind with `publish_url` (and maybe `probe_url`).
#[derive(Debug, Clone)]
pub struct WebhookReceiver {
    /// The shared clients.
    pub http: Http,
    /// Where the publish is `POST`ed.
    pub publish_url: String,
    /// Where an unknown outcome is looked up, if the CMS offers it.
    pub probe_url: Option<String>,
    /// The kind's bearer token, signing secret and CA.
    pub auth: WebhookAuth,
    /// The kind's `http_timeout`: the limit of each try.
    pub timeout: Duration,
}

/// What a probe said.
#[derive(Debug)]
enum Probe {
    /// `200` with a complete JSON body holding a string `url`: the publish
    /// was applied, at that URL.
    Applied(Answer),
    /// `404`: the CMS never received the key; sending is safe.
    NotApplied,
}

/// What a probe answered, read by the contract (docs/receivers.md, "CMSs
/// without idempotency keys"): only `200` with a complete JSON body whose
/// `url` is a non-empty string is [`Probe::Applied`], only `404`
/// [`Probe::NotApplied`]. Everything else is unknown (a retryable
/// [`CallFailure`] saying what came back): a `409` (the key received and
/// still being applied, as the IETF Idempotency-Key draft answers a
/// request in progress), and a `200` that is not a probe's answer — a
/// soft-404 page, a single-page app's route, `{}` — which, taken as
/// applied, would mark every slot published while the CMS got nothing.
fn read_probe(r: Result<Answer, CallFailure>) -> Result<Probe, CallFailure> {
    match r {
        Ok(a) if a.status == 200 && !a.cut && a.url.as_deref().is_some_and(|u| !u.is_empty()) => {
            Ok(Probe::Applied(a))
        }
        Ok(a) if a.status == 200 => {
            let body = if a.cut {
                format!("a body longer than {ANSWER_LIMIT} bytes, not read to its end")
            } else if a.text.is_empty() {
                "an empty body".to_owned()
            } else {
                format!("`{}`", a.text)
            };
            Err(CallFailure::transport(
                Some(200),
                format!("probe answered HTTP 200 without a complete JSON body holding a string \"url\" (not taken as applied: a page, not a probe's answer?): {body}"),
            ))
        }
        Ok(a) => Err(CallFailure::transport(
            Some(a.status),
            format!("probe answered HTTP {} (expected 200 or 404)", a.status),
        )),
        Err(f) if f.status == Some(404) => Ok(Probe::NotApplied),
        Err(f) if f.status == Some(409) => Err(CallFailure {
            error: format!(
                "probe answered HTTP 409 (the CMS has the key and is still applying it): {}",
                f.error.strip_prefix("HTTP 409: ").unwrap_or(&f.error)
            ),
            retryable: true,
            ..f
        }),
        Err(f) => Err(CallFailure {
            error: format!("probe: {}", f.error),
            retryable: true,
            ..f
        }),
    }
}

impl WebhookReceiver {
    fn probe_endpoint<'a>(&'a self, url: &'a str, key: &'a str) -> Endpoint<'a> {
        Endpoint {
            name: "probe",
            url,
            key,
            auth: &self.auth,
            timeout: self.timeout,
        }
    }

    async fn probe(&self, url: &str, key: &str) -> Result<Probe, CallFailure> {
        read_probe(self.http.probe_once(&self.probe_endpoint(url, key)).await)
    }

    /// A 2xx answer (to the publish or to a probe) as the effect: its
    /// `url`, else (a publish answered without one) `<publish_url>#<key>`.
    fn published(&self, a: Answer, key: &str, attempts: u32, found: bool) -> Effect {
        let url = a
            .url
            .clone()
            .unwrap_or_else(|| format!("{}#{key}", self.publish_url));
        Effect::Published(Published {
            response: a.stored(&url),
            url,
            attempts,
            found,
            noted: None,
        })
    }
}

/// slotgate's publish body (the webhook contract in docs/DESIGN.md), as
/// the bytes sent and signed: serialized once per publish, every try
/// sends the same. Written straight from the slot and the draft, not
/// built as a `serde_json::Value` first, which copied the draft's body
/// into a tree only to write it out and drop it. The fields are declared
/// in alphabetical order, the order the `Value` wrote them in, so the
/// bytes are unchanged.
fn body(call: &Call<'_>) -> Bytes {
    #[derive(serde::Serialize)]
    struct Draft<'a> {
        body: &'a str,
        id: i64,
        title: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Body<'a> {
        day: String,
        draft: Draft<'a>,
        due_at: String,
        kind: &'a str,
        nominal_at: String,
        slot: String,
        slot_no: u32,
    }
    let (k, p, d) = (call.slot, call.planned, call.draft);
    let body = Body {
        day: k.day.to_string(),
        draft: Draft {
            body: &d.body,
            id: d.id,
            title: &d.title,
        },
        due_at: p.due_at.to_rfc3339(),
        kind: &k.kind,
        nominal_at: p.nominal_at.to_rfc3339(),
        slot: k.to_string(),
        slot_no: k.slot_no,
    };
    serde_json::to_vec(&body)
        .expect("strings and integers serialize")
        .into()
}

impl Receiver for WebhookReceiver {
    /// The same key on every try. With `probe_url`, a probe comes first
    /// for a resumed claim, for any claim while the gate may have forgotten
    /// a row (no synchronous standby: [`Call::gate_may_forget`]), and after
    /// every try that may have applied; without it, the CMS must dedupe on
    /// the key.
    fn publish<'a>(&'a self, call: &'a Call<'a>, rng: &'a mut StdRng) -> BoxFuture<'a, Effect> {
        Box::pin(async move {
            let key = call.idempotency_key.as_str();
            let body = body(call);
            let policy = call.policy;
            let mut attempts = 0;
            let mut must_probe = call.resumed || call.gate_may_forget;
            loop {
                if let (true, Some(probe_url)) = (must_probe, &self.probe_url) {
                    attempts += 1;
                    match self.probe(probe_url, key).await {
                        Ok(Probe::Applied(a)) => {
                            tracing::info!(slot = %call.slot, resumed = call.resumed, "the probe found the publish applied before (an earlier try, or a run whose gate row a failover lost); not sent again");
                            return self.published(a, key, attempts, true);
                        }
                        Ok(Probe::NotApplied) => {}
                        Err(f) if attempts < policy.max_attempts => {
                            tracing::info!(slot = %call.slot, attempt = attempts, error = %f.error, "probe gave no answer; retrying it before any send");
                            if f.status == Some(409) {
                                tokio::time::sleep(policy.in_progress_delay(rng)).await;
                            } else {
                                back_off(policy, rng, attempts).await;
                            }
                            continue;
                        }
                        Err(f) => {
                            return Effect::Failed(CallReport {
                                attempts,
                                result: Err(f),
                            })
                        }
                    }
                }
                attempts += 1;
                match self
                    .http
                    .call_once(
                        &Endpoint {
                            name: "publish",
                            url: &self.publish_url,
                            key,
                            auth: &self.auth,
                            timeout: self.timeout,
                        },
                        body.clone(),
                    )
                    .await
                {
                    Ok(a) => return self.published(a, key, attempts, false),
                    Err(f) if f.retryable && attempts < policy.max_attempts => {
                        must_probe = f.may_have_applied();
                        let d = policy.delay(rng, attempts - 1);
                        let url = crate::secret::redact_url(&self.publish_url);
                        tracing::info!(url, key, attempt = attempts, error = %f.error, delay_ms = d.as_millis() as u64, probe_first = must_probe && self.probe_url.is_some(), "webhook call failed; retrying");
                        tokio::time::sleep(d).await;
                    }
                    Err(f) => {
                        return Effect::Failed(CallReport {
                            attempts,
                            result: Err(f),
                        })
                    }
                }
            }
        })
    }

    /// With `probe_url`: a probe of a random key the CMS never received
    /// (`slotgate-check-<hex>`) must answer `404`. A probe URL that answers
    /// `200` for anything (a soft-404 page, a single-page app) would mark
    /// every slot published while nothing is sent; one that answers
    /// anything else for a key it never saw would fail every slot whose
    /// outcome was unknown.
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let Some(probe_url) = &self.probe_url else {
                return Ok(());
            };
            let key = format!("slotgate-check-{:016x}", rand::random::<u64>());
            let r = self
                .http
                .probe_once(&self.probe_endpoint(probe_url, &key))
                .await;
            let answered = match r {
                Err(f) if f.status == Some(404) => return Ok(()),
                Ok(a) => format!("HTTP {}: `{}`", a.status, a.text),
                Err(f) => f.error,
            };
            Err(format!(
                "probe_url {} answered {answered} for a key it never received ({key}); it must answer 404 (docs/receivers.md, \"CMSs without idempotency keys\")",
                crate::secret::redact_url(probe_url)
            ))
        })
    }
}

/// The index webhook (`index_url`): `{"slot", "url", "draft_id"}` under
/// the key `<slot key>:index`.
#[derive(Debug, Clone)]
pub struct WebhookIndexer {
    /// The shared clients.
    pub http: Http,
    /// Where the push is `POST`ed.
    pub index_url: String,
    /// The kind's bearer token, signing secret and CA.
    pub auth: WebhookAuth,
    /// The kind's `http_timeout`: the limit of each try.
    pub timeout: Duration,
}

impl Indexer for WebhookIndexer {
    fn push<'a>(
        &'a self,
        call: &'a Call<'a>,
        url: &'a str,
        rng: &'a mut StdRng,
    ) -> BoxFuture<'a, Result<(), Value>> {
        Box::pin(async move {
            let key = call.slot.to_string();
            let body = json!({"slot": key, "url": url, "draft_id": call.draft.id})
                .to_string()
                .into();
            let report = self
                .http
                .call(
                    &Endpoint {
                        name: "index",
                        url: &self.index_url,
                        key: &format!("{key}:index"),
                        auth: &self.auth,
                        timeout: self.timeout,
                    },
                    body,
                    call.policy,
                    rng,
                )
                .await;
            match report.error_detail() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })
    }
}

/// `e` and its sources, `: `-joined: reqwest's own message ("error sending
/// request") hides the cause an operator needs ("invalid peer certificate:
/// UnknownIssuer").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // Reference value: `printf '1700000000.{"a":1}' |
        // openssl dgst -sha256 -hmac whsec_test`.
        let s = signature(&Secret::new("whsec_test"), 1_700_000_000, br#"{"a":1}"#);
        assert_eq!(
            s,
            "t=1700000000,v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"
        );
    }

    /// The publish body is written straight from the slot and the draft;
    /// its bytes (which are what is signed) are those the `json!` value it
    /// replaced wrote: the same fields in the same order, escaped alike.
    #[test]
    fn the_publish_body_keeps_its_bytes() {
        use crate::slot::{PlannedSlot, SlotKey};
        use chrono::{TimeZone, Utc};
        let key = SlotKey::new(
            "news",
            chrono::NaiveDate::from_ymd_opt(2026, 3, 29).unwrap(),
            7,
        );
        let nominal_at = Utc.with_ymd_and_hms(2026, 3, 29, 1, 30, 0).unwrap();
        let planned = PlannedSlot {
            key: key.clone(),
            nominal_at,
            due_at: nominal_at + chrono::Duration::milliseconds(1_234),
            jitter_ms: 1_234,
        };
        let draft = super::super::DraftText {
            id: 42,
            title: "Ünïcode \"quoted\" <b>title</b>".into(),
            body: "line one\nline two\t\u{1}\\ end".into(),
            cms_id: None,
        };
        let call = Call {
            slot: &key,
            planned: &planned,
            draft: &draft,
            idempotency_key: key.to_string(),
            resumed: false,
            gate_may_forget: false,
            now: nominal_at,
            policy: RetryPolicy::default(),
        };
        let (k, p, d) = (&key, &planned, &draft);
        let before = json!({
            "slot": k.to_string(), "kind": k.kind, "day": k.day.to_string(), "slot_no": k.slot_no,
            "nominal_at": p.nominal_at.to_rfc3339(), "due_at": p.due_at.to_rfc3339(),
            "draft": {"id": d.id, "title": d.title, "body": d.body},
        })
        .to_string();
        assert_eq!(String::from_utf8(body(&call).to_vec()).unwrap(), before);
    }
}
