//! The CMS's log as the witness of webhook effects: every call grouped by
//! path and key, the effect of each key (its first applied call), and the
//! checks read from the log alone — calls to unknown paths, a draft under
//! two keys or a key carrying two drafts, second applied calls no fault
//! explains, and effects nobody planned.

use super::{answer_time, draft_token, explains_replay, kind_of_key, utc, Evidence, Verdict};
use crate::model::Class;
use crate::stack::token_kind;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use testkit::cms::Call;

/// The CMS's log, arranged per `(path, key)`.
pub(super) struct CmsLog<'a> {
    /// Calls per (path, key), in arrival order; "applied" ones were
    /// answered 2xx, so a CMS applied them (an idempotent one would apply
    /// the first).
    pub(super) calls_by: BTreeMap<(&'a str, &'a str), Vec<&'a Call>>,
    /// The publish effect per key: the first applied call's body.
    pub(super) effects: BTreeMap<&'a str, &'a Value>,
    /// The index effect per `<slot>:index` key.
    pub(super) index_effects: BTreeMap<&'a str, &'a Value>,
    /// `--cms probe`: the probes per key, in arrival order (the workers'
    /// start-up checks under `slotgate-check-…` keys included).
    pub(super) probes: BTreeMap<&'a str, Vec<&'a Call>>,
}

impl<'a> CmsLog<'a> {
    /// Groups the log; a call to a path the CMS does not serve is
    /// `unexpected`.
    pub(super) fn read(ev: &'a Evidence<'_>, v: &mut Verdict) -> CmsLog<'a> {
        let mut calls_by: BTreeMap<(&str, &str), Vec<&Call>> = BTreeMap::new();
        let mut probes: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
        for c in &ev.calls {
            let key = c.key.as_deref().unwrap_or("");
            match c.path.as_str() {
                "/publish" | "/index" => {
                    calls_by.entry((c.path.as_str(), key)).or_default().push(c)
                }
                "/probe" if ev.probe => probes.entry(key).or_default().push(c),
                other => v.add(
                    Class::Unexpected,
                    None,
                    format!("a call to the unknown CMS path {other:?} (key {key:?})"),
                ),
            }
        }
        for cs in calls_by.values_mut().chain(probes.values_mut()) {
            cs.sort_by_key(|c| c.at);
        }
        let first_applied = |path: &str| -> BTreeMap<&'a str, &'a Value> {
            calls_by
                .iter()
                .filter(|((p, _), _)| *p == path)
                .filter_map(|((_, k), cs)| cs.iter().find(|c| c.applied()).map(|c| (*k, &c.body)))
                .collect()
        };
        let effects = first_applied("/publish");
        let index_effects = first_applied("/index");
        CmsLog {
            calls_by,
            effects,
            index_effects,
            probes,
        }
    }

    /// `applied_twice` (`--cms probe`): the CMS does not dedupe publishes,
    /// so the effects it applied are counted per idempotency key, and a key
    /// applied more than once is a second article, whatever explains it
    /// (a kill, a late answer: the probe contract exists so that none of
    /// them makes one).
    pub(super) fn applied_twice(&self, ev: &Evidence<'_>, v: &mut Verdict) {
        if !ev.probe {
            return;
        }
        for ((path, key), cs) in &self.calls_by {
            if *path != "/publish" {
                continue;
            }
            let applied: Vec<&&Call> = cs.iter().filter(|c| c.applied()).collect();
            if applied.len() < 2 {
                continue;
            }
            let probes: Vec<String> = self
                .probes
                .get(key)
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            format!(
                                "{} {}",
                                utc(p.at).format("%H:%M:%S%.3f"),
                                p.status.map_or("reset".to_owned(), |s| s.to_string())
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            v.add(
                Class::AppliedTwice,
                Some(key),
                format!(
                    "the CMS applied {key:?} {} times (POSTs received at {:?}); its probes: {probes:?}",
                    applied.len(),
                    applied
                        .iter()
                        .map(|c| utc(c.at).format("%H:%M:%S%.3f").to_string())
                        .collect::<Vec<_>>()
                ),
            );
        }
    }

    /// The applied calls under one key, in arrival order.
    pub(super) fn applied(&self, path: &str, key: &str) -> Vec<&'a Call> {
        self.calls_by
            .get(&(path, key))
            .map(|cs| cs.iter().copied().filter(|c| c.applied()).collect())
            .unwrap_or_default()
    }

    /// Every call under one key, in arrival order.
    pub(super) fn calls<'s>(&'s self, path: &'s str, key: &'s str) -> Option<&'s [&'s Call]> {
        let by: &'s BTreeMap<(&'s str, &'s str), Vec<&'s Call>> = &self.calls_by;
        by.get(&(path, key)).map(Vec::as_slice)
    }

    /// `doubled`: a draft under two keys; a key carrying two drafts.
    pub(super) fn doubled(&self, v: &mut Verdict) {
        let mut keys_by_token: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
        for ((path, key), cs) in &self.calls_by {
            if *path == "/publish" {
                for c in cs.iter().filter(|c| c.applied()) {
                    keys_by_token
                        .entry(draft_token(&c.body))
                        .or_default()
                        .insert(key);
                }
            }
        }
        for (token, keys) in &keys_by_token {
            if keys.len() > 1 {
                let first = keys.iter().next().copied();
                v.add(
                    Class::Doubled,
                    first,
                    format!(
                        "draft {token:?} published under {} keys: {keys:?}",
                        keys.len()
                    ),
                );
            }
        }
        for ((path, key), cs) in &self.calls_by {
            let contents: BTreeSet<String> = cs
                .iter()
                .map(|c| {
                    if *path == "/publish" {
                        draft_token(&c.body)
                    } else {
                        format!("{}|{}", c.body["draft_id"], c.body["url"])
                    }
                })
                .collect();
            if contents.len() > 1 {
                v.add(
                    Class::Doubled,
                    Some(key.trim_end_matches(":index")),
                    format!(
                        "key {key:?} sent with {} different contents: {contents:?}",
                        contents.len()
                    ),
                );
            }
        }
    }

    /// `replayed`: a second applied call under one key that no injected
    /// fault in reach, and no answer the client could not wait for,
    /// explains. Returns the second applied calls seen and how many of
    /// them were explained, for the report.
    pub(super) fn replayed(&self, ev: &Evidence<'_>, v: &mut Verdict) -> (usize, usize) {
        let in_reach = |slot: &str| {
            ev.faults
                .iter()
                .any(|r| r.injected && explains_replay(r.fault) && r.affected.contains(slot))
        };
        let mut replays = 0usize;
        let mut explained = 0usize;
        for ((path, key), cs) in &self.calls_by {
            // Judged by `applied_twice`, with no excuse.
            if ev.probe && *path == "/publish" {
                continue;
            }
            let slot = key.trim_end_matches(":index");
            let mut seen_applied = false;
            let mut late_before = false;
            for c in cs {
                if c.applied() {
                    if seen_applied {
                        replays += 1;
                        if late_before || in_reach(slot) {
                            explained += 1;
                        } else {
                            v.add(
                                Class::Replayed,
                                Some(slot),
                                format!(
                                    "{path} {key:?} applied again at {} with no kill, stop, terminate or late answer in reach",
                                    utc(c.at).format("%H:%M:%S%.3f")
                                ),
                            );
                        }
                    }
                    seen_applied = true;
                }
                // An answer the client could not have waited for.
                if answer_time(c).is_none_or(|d| d + Duration::from_millis(100) >= ev.http_timeout)
                {
                    late_before = true;
                }
            }
        }
        (replays, explained)
    }

    /// `unexpected`: effects under keys nobody planned, of another kind's
    /// draft, or an index push without its publish.
    pub(super) fn stray_effects(&self, ev: &Evidence<'_>, v: &mut Verdict) {
        for (key, body) in &self.effects {
            if !ev.plan.contains_key(*key) {
                v.add(
                    Class::Unexpected,
                    Some(key),
                    format!("an effect under key {key:?}, which was never planned"),
                );
                continue;
            }
            let token = draft_token(body);
            if token_kind(&token) != Some(kind_of_key(key)) {
                v.add(
                    Class::Unexpected,
                    Some(key),
                    format!("{key} published draft {token:?} of another kind"),
                );
            }
        }
        for key in self.index_effects.keys() {
            let slot = key.trim_end_matches(":index");
            if !self.effects.contains_key(slot)
                && !ev.plan.get(slot).is_some_and(|k| ev.kinds[*k].record_only)
            {
                v.add(
                    Class::Unexpected,
                    Some(slot),
                    format!("index push {key} without a publish effect"),
                );
            }
        }
    }
}
