//! IndexNow (<https://www.indexnow.org/documentation>): the open protocol
//! several search engines accept for "this URL changed, crawl it".
//!
//! After a publish, one `POST <endpoint>` with
//! `{"host", "key", "keyLocation"?, "urlList": [url]}` as
//! `application/json; charset=utf-8`. `200` and `202` (key not yet
//! verified) are success; `429`, `5xx` and transport errors are retried
//! with the kind's backoff; `400`, `403` (key not valid for the host) and
//! `422` (URL not of the host) fail at once. A push is harmless to repeat,
//! so it needs no look-up. Its failure is the `index_error` detail and
//! never undoes the publish.
//!
//! A URL whose host is not the configured `host` (compared without regard
//! to case, as host names are: `Blog.Example` is `blog.example`) is not
//! sent at all: IndexNow would refuse it (`422`), and the detail says why
//! sooner. The `host` sent is the configured one in lower case, as the
//! URL's own host is written.
//!
//! The request carries the key, and an endpoint answering `400` may echo
//! it: every spelling of the key is hidden from the answer before anything
//! of it is kept ([`crate::untrusted::excerpt`]).

use super::webhook::{plain_error, retrying, send_hiding, CallFailure};
use super::{Call, Indexer};
use crate::config::IndexNowConfig;
use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use serde_json::{json, Value};

/// The IndexNow push of one kind.
#[derive(Debug, Clone)]
pub struct IndexNow {
    /// The kind's HTTP client.
    pub client: reqwest::Client,
    /// Endpoint, key, host.
    pub config: IndexNowConfig,
    /// The kind's `http_timeout`: the limit of each try.
    pub timeout: std::time::Duration,
}

impl IndexNow {
    /// The request body for `url`.
    pub fn body(&self, url: &str) -> Value {
        let mut b = json!({
            "host": self.config.host.to_ascii_lowercase(),
            "key": self.config.key.expose(),
            "urlList": [url],
        });
        if let Some(l) = &self.config.key_location {
            b["keyLocation"] = l.as_str().into();
        }
        b
    }
}

impl Indexer for IndexNow {
    fn push<'a>(
        &'a self,
        call: &'a Call<'a>,
        url: &'a str,
        rng: &'a mut StdRng,
    ) -> BoxFuture<'a, Result<(), Value>> {
        Box::pin(async move {
            let host = reqwest::Url::parse(url)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned));
            if !host
                .as_deref()
                .is_some_and(|h| h.eq_ignore_ascii_case(&self.config.host))
            {
                return Err(json!({
                    "indexnow": "not sent",
                    "error": format!("the published URL's host {:?} is not the configured indexnow.host {:?}", host.unwrap_or_default(), self.config.host),
                }));
            }
            let body = self.body(url).to_string();
            let endpoint = self.config.endpoint.as_str();
            let secrets = crate::untrusted::secret_spellings(self.config.key.expose());
            let report = retrying(call.policy, rng, endpoint, "", || async {
                let req = self
                    .client
                    .post(endpoint)
                    .timeout(self.timeout)
                    .header("Content-Type", "application/json; charset=utf-8")
                    .body(body.clone());
                send_hiding(req, plain_error, &secrets)
                    .await
                    .and_then(|a| match a.status {
                        200 | 202 => Ok(a),
                        s => Err(CallFailure {
                            status: Some(s),
                            error: format!("HTTP {s}: IndexNow expects 200 or 202"),
                            retryable: false,
                            location: None,
                        }),
                    })
            })
            .await;
            match report.error_detail() {
                None => Ok(()),
                Some(mut e) => {
                    e["indexnow"] = "failed".into();
                    Err(e)
                }
            }
        })
    }
}
