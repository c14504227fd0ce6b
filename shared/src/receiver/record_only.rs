//! The record-only receiver: a kind without `publish_url` or
//! `[kinds.wordpress]`. Its whole effect is the gate row, settled inside the
//! gate transaction, so a publish here calls nobody; it only names the URL
//! the record carries (`record-only://<kind>/<draft id>`).

use super::{Call, Effect, Published, Receiver};
use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use serde_json::json;

/// No receiver at all.
#[derive(Debug, Clone, Copy)]
pub struct RecordOnly;

impl Receiver for RecordOnly {
    fn publish<'a>(&'a self, call: &'a Call<'a>, _rng: &'a mut StdRng) -> BoxFuture<'a, Effect> {
        let url = format!("record-only://{}/{}", call.slot.kind, call.draft.id);
        Box::pin(async move {
            Effect::Published(Published {
                response: json!({"url": url, "record_only": true}),
                url,
                attempts: 0,
                found: false,
                noted: None,
            })
        })
    }
}
