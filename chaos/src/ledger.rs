//! The harness's own ledger of slotgate's tables, and the record-only judge.
//!
//! A record-only slot never leaves Postgres, so no CMS can witness it: the
//! harness installs, before any worker starts, row triggers on `draft`,
//! `publish_slot` and `daily_quota` that copy every committed change (with
//! the database's clock and the transaction id) into a schema of its own,
//! `chaos_ledger`, which slotgate never reads. A change rolled back leaves
//! no trace there, exactly like its effect. The rules judged from it hold
//! for every kind; they are the only witness for record-only ones.

use crate::model::{Class, Violation};
use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Installs the ledger (idempotent; a reused database keeps its events).
pub async fn install(pool: &PgPool) -> Result<()> {
    let mut tx = pool.begin().await?;
    for stmt in [
        "CREATE SCHEMA IF NOT EXISTS chaos_ledger",
        "CREATE TABLE IF NOT EXISTS chaos_ledger.event (
            id  bigserial   PRIMARY KEY,
            at  timestamptz NOT NULL DEFAULT clock_timestamp(),
            txid bigint     NOT NULL DEFAULT txid_current(),
            tbl text        NOT NULL,
            op  text        NOT NULL,
            old jsonb,
            new jsonb)",
        "CREATE OR REPLACE FUNCTION chaos_ledger.log() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
            INSERT INTO chaos_ledger.event (tbl, op, old, new)
            VALUES (TG_TABLE_NAME, TG_OP,
                    CASE WHEN TG_OP IN ('UPDATE', 'DELETE') THEN to_jsonb(OLD) END,
                    CASE WHEN TG_OP IN ('INSERT', 'UPDATE') THEN to_jsonb(NEW) END);
            RETURN NULL;
         END $$",
    ] {
        sqlx::query(stmt).execute(&mut *tx).await?;
    }
    for table in ["draft", "publish_slot", "daily_quota"] {
        sqlx::query(&format!(
            "CREATE OR REPLACE TRIGGER chaos_ledger_row AFTER INSERT OR UPDATE OR DELETE ON public.{table}
             FOR EACH ROW EXECUTE FUNCTION chaos_ledger.log()"
        ))
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "CREATE OR REPLACE TRIGGER chaos_ledger_truncate AFTER TRUNCATE ON public.{table}
             FOR EACH STATEMENT EXECUTE FUNCTION chaos_ledger.log()"
        ))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await.context("installing the chaos ledger")
}

/// One committed row change.
#[derive(Debug, Clone)]
pub struct Event {
    pub at: DateTime<Utc>,
    pub txid: i64,
    pub tbl: String,
    pub op: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// An event as selected: at, txid, tbl, op, old, new.
type EventRow = (
    DateTime<Utc>,
    i64,
    String,
    String,
    Option<Value>,
    Option<Value>,
);

/// Every event after id `floor` (this run's), oldest first.
pub async fn read(pool: &PgPool, floor: i64) -> Result<Vec<Event>> {
    let rows: Vec<EventRow> = sqlx::query_as(
        "SELECT at, txid, tbl, op, old, new FROM chaos_ledger.event WHERE id > $1 ORDER BY id",
    )
    .bind(floor)
    .fetch_all(pool)
    .await
    .context("reading the chaos ledger")?;
    Ok(rows
        .into_iter()
        .map(|(at, txid, tbl, op, old, new)| Event {
            at,
            txid,
            tbl,
            op,
            old,
            new,
        })
        .collect())
}

/// The ledger's last event id (events after it are this run's).
pub async fn floor(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM chaos_ledger.event")
            .fetch_one(pool)
            .await?,
    )
}

fn slot_key(row: &Value) -> Option<String> {
    Some(format!(
        "{}:{}:{}",
        row.get("kind")?.as_str()?,
        row.get("day")?.as_str()?,
        row.get("slot")?.as_i64()?
    ))
}

fn post_id(row: Option<&Value>) -> Option<i64> {
    row?.get("post_id")?.as_i64()
}

/// What the ledger says, per slot: when it became published (database
/// clock), and per kind and day: the quota's highest and last value.
#[derive(Debug, Default)]
pub struct Facts {
    pub published_at: HashMap<String, DateTime<Utc>>,
    /// (kind, day) → (highest used, last used).
    pub quota: BTreeMap<(String, String), (i64, i64)>,
}

/// The record-only judge: each draft bound to at most one slot and never
/// rebound, gate rows never deleted, and the facts the CMS-side judge
/// needs for record-only kinds. `kinds`: this run's kind names.
pub fn judge(events: &[Event], kinds: &HashSet<&str>) -> (Facts, Vec<Violation>) {
    let mut out = Vec::new();
    let mut facts = Facts::default();
    let ours = |row: Option<&Value>| {
        row.and_then(|r| r.get("kind"))
            .and_then(Value::as_str)
            .is_some_and(|k| kinds.contains(k))
    };
    let mut bound: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    let mut inserted_in: HashMap<i64, i64> = HashMap::new();
    for e in events {
        let (old, new) = (e.old.as_ref(), e.new.as_ref());
        if e.op == "TRUNCATE" {
            out.push(Violation::new(
                Class::GateDeleted,
                None,
                format!("{} was truncated at {}", e.tbl, e.at),
            ));
            continue;
        }
        if !ours(old) && !ours(new) {
            continue;
        }
        match e.tbl.as_str() {
            "publish_slot" => {
                let row = new.or(old).expect("a row event has a row");
                let key = slot_key(row).unwrap_or_default();
                let id = row.get("id").and_then(Value::as_i64).unwrap_or(0);
                match e.op.as_str() {
                    "INSERT" => {
                        inserted_in.insert(id, e.txid);
                    }
                    // A row inserted and deleted by one transaction was never
                    // seen by anyone (the batch gate gives back a slot it
                    // found no draft for); any other delete undoes the gate.
                    "DELETE" if inserted_in.get(&id) != Some(&e.txid) => {
                        out.push(Violation::new(
                            Class::GateDeleted,
                            Some(key.clone()),
                            format!("the gate row of {key} (state {}) was deleted", row["state"]),
                        ));
                    }
                    _ => {}
                }
                if let Some(p) = post_id(new) {
                    if let Some(before) = post_id(old).filter(|b| *b != p) {
                        out.push(Violation::new(
                            Class::DraftBoundTwice,
                            Some(key.clone()),
                            format!("{key} was bound to draft {before}, then rebound to draft {p}"),
                        ));
                    }
                    bound.entry(p).or_default().insert(key.clone());
                }
                let became_published = new.is_some_and(|n| n["state"] == "published")
                    && old.is_none_or(|o| o["state"] != "published");
                if became_published {
                    facts.published_at.entry(key).or_insert(e.at);
                }
            }
            "draft" => {
                let was = old.and_then(|o| o.get("slot_key")).and_then(Value::as_str);
                let now = new.and_then(|n| n.get("slot_key")).and_then(Value::as_str);
                if let (Some(a), Some(b)) = (was, now) {
                    if a != b {
                        let id = new.and_then(|n| n.get("id")).cloned().unwrap_or_default();
                        out.push(Violation::new(
                            Class::DraftBoundTwice,
                            Some(b.to_owned()),
                            format!("draft {id} was bound to {a}, then rebound to {b}"),
                        ));
                    }
                }
            }
            "daily_quota" => {
                if let Some(n) = new {
                    let k = (
                        n["kind"].as_str().unwrap_or("").to_owned(),
                        n["day"].as_str().unwrap_or("").to_owned(),
                    );
                    let used = n["used"].as_i64().unwrap_or(0);
                    let q = facts.quota.entry(k).or_insert((used, used));
                    q.0 = q.0.max(used);
                    q.1 = used;
                }
                if e.op == "DELETE" {
                    out.push(Violation::new(
                        Class::Quota,
                        None,
                        format!("a daily_quota row was deleted: {:?}", old),
                    ));
                }
            }
            _ => {}
        }
    }
    // A draft seen on two different slots was bound twice.
    for (draft, keys) in &bound {
        if keys.len() > 1 {
            out.push(Violation::new(
                Class::DraftBoundTwice,
                keys.iter().next().cloned(),
                format!("draft {draft} was bound to {} slots: {keys:?}", keys.len()),
            ));
        }
    }
    (facts, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(txid: i64, tbl: &str, op: &str, old: Option<Value>, new: Option<Value>) -> Event {
        Event {
            at: Utc::now(),
            txid,
            tbl: tbl.into(),
            op: op.into(),
            old,
            new,
        }
    }

    fn ins(txid: i64, row: Value) -> Event {
        ev(txid, "publish_slot", "INSERT", None, Some(row))
    }

    fn upd(txid: i64, old: Value, new: Value) -> Event {
        ev(txid, "publish_slot", "UPDATE", Some(old), Some(new))
    }

    fn del(txid: i64, row: Value) -> Event {
        ev(txid, "publish_slot", "DELETE", Some(row), None)
    }

    fn slot(id: i64, no: i64, state: &str, post: Option<i64>) -> Value {
        json!({"id": id, "kind": "a", "day": "2026-01-01", "slot": no, "state": state, "post_id": post})
    }

    fn classes(v: &[Violation]) -> Vec<&'static str> {
        v.iter().map(|x| x.class.name()).collect()
    }

    #[test]
    fn a_clean_ledger_has_facts_and_no_violations() {
        let kinds = HashSet::from(["a"]);
        let quota = json!({"kind": "a", "day": "2026-01-01", "used": 1});
        let other =
            json!({"id": 9, "kind": "b", "day": "2026-01-01", "slot": 1, "state": "published"});
        let events = [
            ins(1, slot(1, 1, "claimed", None)),
            upd(
                1,
                slot(1, 1, "claimed", None),
                slot(1, 1, "published", Some(7)),
            ),
            ev(1, "daily_quota", "INSERT", None, Some(quota)),
            // Another run's kind is not ours.
            del(2, other),
        ];
        let (facts, v) = judge(&events, &kinds);
        assert!(v.is_empty(), "{v:?}");
        assert!(facts.published_at.contains_key("a:2026-01-01:1"));
        assert_eq!(
            facts.quota[&("a".to_owned(), "2026-01-01".to_owned())],
            (1, 1)
        );
    }

    #[test]
    fn a_draft_on_two_slots_or_a_rebound_slot_is_bound_twice() {
        let kinds = HashSet::from(["a"]);
        let two = [
            ins(1, slot(1, 1, "published", Some(7))),
            ins(2, slot(2, 2, "published", Some(7))),
        ];
        assert_eq!(classes(&judge(&two, &kinds).1), ["draft_bound_twice"]);
        let rebound = [
            ins(1, slot(1, 1, "published", Some(7))),
            upd(
                2,
                slot(1, 1, "published", Some(7)),
                slot(1, 1, "published", Some(8)),
            ),
        ];
        assert_eq!(classes(&judge(&rebound, &kinds).1), ["draft_bound_twice"]);
        let was = json!({"id": 7, "kind": "a", "slot_key": "a:2026-01-01:1"});
        let now = json!({"id": 7, "kind": "a", "slot_key": "a:2026-01-01:2"});
        let draft = [ev(3, "draft", "UPDATE", Some(was), Some(now))];
        assert_eq!(classes(&judge(&draft, &kinds).1), ["draft_bound_twice"]);
    }

    #[test]
    fn a_committed_gate_row_must_never_be_deleted() {
        let kinds = HashSet::from(["a"]);
        // Inserted and given back by one transaction: never seen.
        let same_tx = [
            ins(5, slot(1, 1, "claimed", None)),
            del(5, slot(1, 1, "claimed", None)),
        ];
        assert!(judge(&same_tx, &kinds).1.is_empty());
        let later = [
            ins(5, slot(1, 1, "published", Some(3))),
            del(6, slot(1, 1, "published", Some(3))),
        ];
        assert_eq!(classes(&judge(&later, &kinds).1), ["gate_deleted"]);
        let truncate = [ev(6, "publish_slot", "TRUNCATE", None, None)];
        assert_eq!(classes(&judge(&truncate, &kinds).1), ["gate_deleted"]);
    }
}
