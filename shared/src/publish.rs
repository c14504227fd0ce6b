//! The publish and index webhook client.
//!
//! Every call carries an `Idempotency-Key` derived from the slot (`<slot key>`
//! for publish, `<slot key>:index` for the index push), so a retry, a
//! takeover by another worker, or an operator's `retry` is the *same* request
//! to the CMS. Timeouts, connection errors, 408, 429 and 5xx are retried with
//! full jitter; any other 4xx fails at once.

use crate::retry::RetryPolicy;
use rand::Rng;
use serde_json::Value;
use std::time::Duration;

/// One failed try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    /// HTTP status, when the server answered.
    pub status: Option<u16>,
    pub error: String,
    pub retryable: bool,
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
    /// The body, when it was JSON.
    pub body: Option<Value>,
}

impl CallReport {
    /// The `publish_error`/`index_error` detail: status, attempts, last error.
    pub fn error_detail(&self) -> Option<Value> {
        let Err(f) = &self.result else { return None };
        Some(serde_json::json!({"status": f.status, "attempts": self.attempts, "error": f.error}))
    }
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
                return Err(CallFailure {
                    status: None,
                    error: format!("{kind}: {e}"),
                    retryable: true,
                });
            }
        };
        let status = resp.status().as_u16();
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout reading body"
                } else {
                    "error reading body"
                };
                return Err(CallFailure {
                    status: Some(status),
                    error: format!("{kind}: {e}"),
                    retryable: true,
                });
            }
        };
        if (200..300).contains(&status) {
            return Ok(Answer {
                status,
                body: serde_json::from_str(&text).ok(),
            });
        }
        let retryable = status == 408 || status == 429 || status >= 500;
        let mut snippet: String = text.chars().take(200).collect();
        if snippet.is_empty() {
            snippet = "(empty body)".into();
        }
        Err(CallFailure {
            status: Some(status),
            error: format!("HTTP {status}: {snippet}"),
            retryable,
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
