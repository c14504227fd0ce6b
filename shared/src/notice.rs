//! Notices: what an operator is told, as [Standard Webhooks] events.
//!
//! slotgate records a true outcome for every slot, but a record only helps
//! someone who goes and reads it. A notice is pushed instead, for the fates
//! that need a person: a slot `failed`, a slot `skipped/missed_deadline`, a
//! delivery dead-lettered, and the drafts predicted to run out within
//! `runway_days` (the forecast's `runs_dry_on`).
//!
//! The events are an outbox (`notice` table): each is written in the same
//! transaction as the outcome it reports (a trigger on the gate row for the
//! slot fates, the dead letter's own insert, the leader's forecast for the
//! runway), and the leader sends what is pending
//! ([`crate::worker`]'s notices duty). So a crash between the outcome and
//! the send loses nothing, and a slow or unreachable receiver delays no
//! delivery: the executor never waits on a notice.
//!
//! This module is the wire form only, pure: the event names
//! ([`Event`]), the body ([`Notice::body`], fixed when the event is written,
//! so every resend carries the same bytes under the same `webhook-id`), and
//! the signature ([`Signer`]): `webhook-signature: v1,<base64 HMAC-SHA256
//! over "<id>.<timestamp>.<body>">` with the key decoded from a
//! `whsec_<base64>` secret, as the spec says. The timestamp is the attempt's
//! (receivers reject old ones), so it is signed per send.
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com/

use crate::secret::Secret;
use base64::Engine;
use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};

/// What a notice reports; its `type` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// A slot's outcome is `failed` (its publish kept failing).
    SlotFailed,
    /// A slot was recorded `skipped/missed_deadline`: it never ran in time.
    SlotMissed,
    /// A delivery was not to be believed and went to the dead letters.
    DeadLettered,
    /// A kind's drafts are predicted to run out within `runway_days`.
    RunwayLow,
}

impl Event {
    /// Every event, in the order docs list them.
    pub const ALL: [Event; 4] = [
        Event::SlotFailed,
        Event::SlotMissed,
        Event::DeadLettered,
        Event::RunwayLow,
    ];

    /// The spelling on the wire, in the config's `events` and in the
    /// `notice.event` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::SlotFailed => "slot.failed",
            Event::SlotMissed => "slot.missed",
            Event::DeadLettered => "slot.dead_lettered",
            Event::RunwayLow => "runway.low",
        }
    }

    /// The event spelt `s`, if any.
    pub fn parse(s: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// One event as the outbox holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The outbox row.
    pub id: i64,
    /// The `webhook-id`: the same on every resend of this event.
    pub msg_id: String,
    /// What it reports.
    pub event: Event,
    /// The kind, when known (a dead letter may name none).
    pub kind: Option<String>,
    /// The slot's local day.
    pub day: Option<NaiveDate>,
    /// The slot's number.
    pub slot: Option<i32>,
    /// The slot key: as received for a dead letter, else `kind:day:slot`
    /// (the store spells it with `slot::SlotKey` when it reads the row).
    pub slot_key: Option<String>,
    /// `failed` or `skipped`.
    pub outcome: Option<String>,
    /// The outcome's reason.
    pub reason: Option<String>,
    /// The first day a slot is predicted `no_ready_draft` (runway).
    pub runs_dry_on: Option<NaiveDate>,
    /// When the event was written (Postgres's clock): the body's
    /// `timestamp`.
    pub created_at: DateTime<Utc>,
    /// Sends tried so far.
    pub attempts: i32,
}

impl Notice {
    /// The body, the same bytes on every send: `{"type", "timestamp",
    /// "data"}` as the spec shapes it; `data` names the slot (key, kind,
    /// local day, number), outcome and reason, or the kind and
    /// `runs_dry_on`.
    pub fn body(&self) -> Vec<u8> {
        let data = match self.event {
            Event::RunwayLow => json!({
                "kind": self.kind,
                "runs_dry_on": self.runs_dry_on.map(|d| d.to_string()),
            }),
            _ => json!({
                "slot_key": self.slot_key,
                "kind": self.kind,
                "day": self.day.map(|d| d.to_string()),
                "slot": self.slot,
                "outcome": self.outcome,
                "reason": self.reason,
            }),
        };
        let body: Value = json!({
            "type": self.event.as_str(),
            "timestamp": self.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            "data": data,
        });
        serde_json::to_vec(&body).expect("a JSON value serializes")
    }
}

/// Why a `whsec_` secret was refused (never showing it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// It does not start with `whsec_`.
    #[error("expected a Standard Webhooks secret: whsec_ followed by base64")]
    Prefix,
    /// What follows `whsec_` is not base64.
    #[error("what follows whsec_ is not base64")]
    Base64,
    /// The key is shorter than 24 or longer than 64 bytes (the spec's range).
    #[error("the key is {0} bytes; Standard Webhooks keys are 24 to 64 bytes")]
    Length(usize),
}

/// Signs notices with one `whsec_` key, decoded once at start. `Debug`
/// shows no key.
#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(***)")
    }
}

impl Signer {
    /// The signer of `secret` (`whsec_<base64>`, 24 to 64 bytes of key).
    pub fn new(secret: &Secret) -> Result<Signer, SecretError> {
        let b64 = secret
            .expose()
            .strip_prefix("whsec_")
            .ok_or(SecretError::Prefix)?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| SecretError::Base64)?;
        if !(24..=64).contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Signer { key })
    }

    /// The `webhook-signature` value of `body` sent as `msg_id` at Unix
    /// second `timestamp`: `v1,<base64 HMAC-SHA256>`.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&self.key).expect("HMAC takes any key");
        mac.update(format!("{msg_id}.{timestamp}.").as_bytes());
        mac.update(body);
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        format!("v1,{sig}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(event: Event) -> Notice {
        Notice {
            id: 1,
            msg_id: "msg_1".into(),
            event,
            kind: Some("article".into()),
            day: NaiveDate::from_ymd_opt(2026, 12, 7),
            slot: Some(2),
            slot_key: Some("article:2026-12-07:2".into()),
            outcome: Some("failed".into()),
            reason: Some("publish_error".into()),
            runs_dry_on: None,
            created_at: DateTime::from_timestamp(1_780_000_000, 123_000_000).unwrap(),
            attempts: 0,
        }
    }

    #[test]
    fn a_slot_event_names_the_slot_outcome_and_reason() {
        let body: Value = serde_json::from_slice(&notice(Event::SlotFailed).body()).unwrap();
        assert_eq!(body["type"], "slot.failed");
        assert_eq!(body["timestamp"], "2026-05-28T20:26:40.123Z");
        assert_eq!(body["data"]["slot_key"], "article:2026-12-07:2");
        assert_eq!(body["data"]["day"], "2026-12-07");
        assert_eq!(body["data"]["reason"], "publish_error");
    }

    #[test]
    fn every_event_round_trips_its_spelling() {
        for e in Event::ALL {
            assert_eq!(Event::parse(e.as_str()), Some(e));
        }
        assert_eq!(Event::parse("slot.published"), None);
    }

    // The spec's own example (standard-webhooks, spec/standard-webhooks.md):
    // secret, id, timestamp and payload give this signature.
    #[test]
    fn the_signature_matches_the_specs_example() {
        let s = Signer::new(&Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            s.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn bad_secrets_are_refused_without_showing_them() {
        for (s, want) in [
            ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", SecretError::Prefix),
            ("whsec_!!!", SecretError::Base64),
            ("whsec_c2hvcnQ=", SecretError::Length(5)),
        ] {
            let e = Signer::new(&Secret::new(s)).unwrap_err();
            assert_eq!(e, want);
            assert!(!e.to_string().contains(s));
        }
        assert_eq!(
            format!(
                "{:?}",
                Signer::new(&Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
            ),
            "Ok(Signer(***))"
        );
    }
}
