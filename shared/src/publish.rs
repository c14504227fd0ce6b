//! The publish and index webhook client.
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
//! are read, and only its `url` and a truncated copy are kept.

use crate::retry::RetryPolicy;
use crate::untrusted;
use rand::Rng;
use serde_json::Value;
use std::time::Duration;

/// The most bytes of an answer's body that are read; the rest is never
/// received, so a CMS (or whatever answers at its address) cannot make a
/// worker buffer or store megabytes.
pub const ANSWER_LIMIT: usize = 64 * 1024;

/// One failed try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    /// HTTP status, when the server answered.
    pub status: Option<u16>,
    pub error: String,
    pub retryable: bool,
    /// Where a 3xx answer pointed (truncated); never followed.
    pub location: Option<String>,
}

impl CallFailure {
    fn transport(status: Option<u16>, error: String) -> Self {
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
    pub attempts: u32,
    pub result: Result<Answer, CallFailure>,
}

/// A 2xx answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    /// The `url` of a JSON answer `{"url": "…"}`.
    pub url: Option<String>,
    /// The answer's text as stored: cut by [`untrusted::truncate`].
    pub text: String,
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
async fn read_bounded(mut resp: reqwest::Response) -> Result<(Vec<u8>, bool), reqwest::Error> {
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

/// The HTTP client; one per process (it pools connections).
#[derive(Debug, Clone)]
pub struct Webhook {
    client: reqwest::Client,
}

impl Default for Webhook {
    fn default() -> Self {
        Self::new()
    }
}

impl Webhook {
    pub fn new() -> Self {
        let client = reqwest::Client::builder()
            .user_agent(concat!("slotgate/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            // A redirect is not a publish (see the module doc).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("static reqwest configuration");
        Self { client }
    }

    /// One try: POST `body` to `url` with the idempotency key. `endpoint`
    /// (`publish`, `index`) labels the attempt in the metrics.
    pub async fn call_once(
        &self,
        endpoint: &'static str,
        url: &str,
        key: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Answer, CallFailure> {
        let r = self.try_once(url, key, body, timeout).await;
        let class = match &r {
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
        r
    }

    async fn try_once(
        &self,
        url: &str,
        key: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Answer, CallFailure> {
        let resp = self
            .client
            .post(url)
            .timeout(timeout)
            .header("Content-Type", "application/json")
            .header("Idempotency-Key", key)
            .body(body.to_string())
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connection error"
                } else {
                    "request error"
                };
                return Err(CallFailure::transport(None, format!("{kind}: {e}")));
            }
        };
        let status = resp.status().as_u16();
        if (300..400).contains(&status) {
            let location = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .map(|l| untrusted::lossy(l.as_bytes()));
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
                return Err(CallFailure::transport(Some(status), format!("{kind}: {e}")));
            }
        };
        if (200..300).contains(&status) {
            let url = if cut {
                None
            } else {
                serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|b| b.get("url")?.as_str().map(str::to_owned))
            };
            return Ok(Answer {
                status,
                url,
                text: untrusted::lossy(&bytes),
                cut,
            });
        }
        let retryable = status == 408 || status == 429 || status >= 500;
        let mut snippet = untrusted::lossy(&bytes);
        if snippet.is_empty() {
            snippet = "(empty body)".into();
        }
        Err(CallFailure {
            status: Some(status),
            error: format!("HTTP {status}: {snippet}"),
            retryable,
            location: None,
        })
    }

    /// Calls with retries. The key never changes between tries.
    #[allow(clippy::too_many_arguments)]
    pub async fn call<R: Rng + Send>(
        &self,
        endpoint: &'static str,
        url: &str,
        key: &str,
        body: &Value,
        timeout: Duration,
        policy: RetryPolicy,
        rng: &mut R,
    ) -> CallReport {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.call_once(endpoint, url, key, body, timeout).await {
                Ok(a) => {
                    return CallReport {
                        attempts: attempt,
                        result: Ok(a),
                    }
                }
                Err(f) if f.retryable && attempt < policy.max_attempts => {
                    let d = policy.delay(rng, attempt - 1);
                    tracing::info!(url, key, attempt, error = %f.error, delay_ms = d.as_millis() as u64, "webhook call failed; retrying");
                    tokio::time::sleep(d).await;
                }
                Err(f) => {
                    return CallReport {
                        attempts: attempt,
                        result: Err(f),
                    }
                }
            }
        }
    }
}
