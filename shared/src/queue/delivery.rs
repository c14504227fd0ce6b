//! A stream entry as a worker receives it ([`Delivery`]) and what can be
//! wrong with its bytes ([`Defect`]): Redis replies are parsed as raw
//! values, entry by entry, so one bad entry never fails the read of the
//! entries around it.

use super::{MAX_FIELDS, MAX_FIELD_BYTES, MAX_SLOT_BYTES};
use crate::untrusted;
use redis::Value;

/// What is wrong with the bytes of a stream entry. Such an entry is
/// recorded `failed/bad_message` with this as its detail, dead-lettered and
/// acknowledged; the entries read with it are not affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Defect {
    /// A field name is not valid UTF-8 (shown lossily, truncated).
    #[error("field name {0:?} is not UTF-8")]
    NameNotUtf8(String),
    /// The value of this field is not valid UTF-8.
    #[error("field `{0}` is not UTF-8")]
    ValueNotUtf8(String),
    /// `slot` is longer than [`MAX_SLOT_BYTES`] (its length in bytes).
    #[error("field `slot` is {0} bytes long (at most {MAX_SLOT_BYTES})")]
    SlotTooLong(usize),
    /// A field other than `slot`, `caller`, `enqueued_at` (truncated).
    #[error(
        "unknown field {0:?} (a delivery has only `slot`, `caller`, `enqueued_at` and `early`)"
    )]
    UnknownField(String),
    /// A field given more than once: which value counts would be a guess.
    #[error("field `{0}` given more than once")]
    RepeatedField(String),
    /// Not shaped like a stream entry (an odd field list, a non-string).
    #[error("malformed entry")]
    Malformed,
    /// A field name or value longer than [`MAX_FIELD_BYTES`], or more than
    /// [`MAX_FIELDS`] fields: cut in Redis before it was read (the entry's
    /// size in bytes).
    #[error("entry is {0} bytes (a field over {MAX_FIELD_BYTES} bytes or more than {MAX_FIELDS} fields); cut in Redis, never read whole")]
    Oversize(u64),
}

/// Where a stream entry is: its partition and its id in that partition's
/// stream (ids of different partitions' streams may be equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryRef<'a> {
    /// The partition (0 in the default layout).
    pub partition: u16,
    /// The entry id in that partition's stream.
    pub id: &'a str,
}

impl<'a> EntryRef<'a> {
    /// The place of an entry recorded as `recorded` (see
    /// [`Delivery::entry_id`]) in partition `partition`.
    pub fn recorded(partition: u16, recorded: &'a str) -> Self {
        EntryRef {
            partition,
            id: match partition {
                0 => recorded,
                _ => recorded.split('@').next().unwrap_or(recorded),
            },
        }
    }
}

/// The id an entry of partition `p`'s stream is recorded under: the
/// stream's own id in partition 0, `<id>@<p>` otherwise (stream ids hold
/// no `@`).
pub fn recorded_entry_id(stream_id: &str, p: u16) -> String {
    match p {
        0 => stream_id.to_owned(),
        _ => format!("{stream_id}@{p}"),
    }
}

/// One stream entry as a worker receives it. Every string in it is a
/// bounded copy, so it can be logged and stored as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The entry's id as recorded (execution rows, dead letters, `trigger
    /// --wait`): what makes a redelivery of an already recorded entry
    /// recognisable. The stream's own id in partition 0 (and in the
    /// default layout); `<id>@<p>` in partition `p` > 0, because ids are
    /// unique only within one stream and two partitions hand out the same
    /// id in the same millisecond ([`recorded_entry_id`]). The stream's
    /// own id, for acknowledging, is [`Delivery::entry`]'s.
    pub entry_id: String,
    /// How many times the group has handed this entry out (1 = first time).
    pub deliveries: u64,
    /// The partition whose stream the entry is in (0 in the default
    /// layout): where it is acknowledged.
    pub partition: u16,
    pub(super) slot: Option<String>,
    pub(super) caller: Option<String>,
    pub(super) enqueued_at: Option<String>,
    /// `early=1` from `planner trigger --early`.
    pub(super) early: Option<String>,
    pub(super) defect: Option<Defect>,
}

impl Delivery {
    /// A delivery made in process rather than read from the stream (the
    /// chaos suite's sabotage hooks and tests): well formed, first seen.
    pub fn synthetic(entry_id: String, slot: &str, caller: &str) -> Delivery {
        Delivery {
            entry_id,
            deliveries: 1,
            partition: 0,
            slot: Some(slot.to_owned()),
            caller: Some(caller.to_owned()),
            enqueued_at: None,
            early: None,
            defect: None,
        }
    }
    /// The entry's place: its partition and its id in that partition's
    /// stream (what is acknowledged and kept alive).
    pub fn entry(&self) -> EntryRef<'_> {
        EntryRef::recorded(self.partition, &self.entry_id)
    }

    /// This delivery, read from partition `p`'s stream.
    pub(super) fn in_partition(mut self, p: u16) -> Self {
        self.partition = p;
        if p > 0 {
            self.entry_id = recorded_entry_id(&self.entry_id, p);
        }
        self
    }

    /// The `slot` field as sent, not yet parsed; `None` when missing.
    pub fn slot(&self) -> Option<&str> {
        self.slot.as_deref()
    }
    /// Who enqueued the entry (`scheduler`, `manual`, `backfill`,
    /// `cronjob`, …); `unknown` when the field is missing. It decides the
    /// starting-deadline exemption and shows up in every execution row.
    pub fn caller(&self) -> &str {
        self.caller.as_deref().unwrap_or("unknown")
    }
    /// The `enqueued_at` field as sent (Unix ms), kept for the record only.
    pub fn enqueued_at(&self) -> Option<&str> {
        self.enqueued_at.as_deref()
    }
    /// The `early` field, which only `planner trigger --early` sets.
    pub fn early(&self) -> Option<&str> {
        self.early.as_deref()
    }
    /// What was wrong with the entry's bytes, if anything (the first thing
    /// found).
    pub fn defect(&self) -> Option<&Defect> {
        self.defect.as_ref()
    }

    /// Marks an entry `cut.lua` cut (its full size in bytes): whatever
    /// else is wrong with it, that is what the record says.
    pub(super) fn cut_in_redis(&mut self, size: u64) {
        self.defect = Some(Defect::Oversize(size));
    }

    /// Reads an entry's flat `[name, value, ...]` list. Never fails: what
    /// is wrong becomes the [`Defect`], and only bounded copies are kept.
    pub(super) fn parse(entry_id: String, flat: &[&[u8]], deliveries: u64) -> Delivery {
        let mut d = Delivery {
            entry_id,
            deliveries,
            partition: 0,
            slot: None,
            caller: None,
            enqueued_at: None,
            early: None,
            defect: None,
        };
        let found = |d: &mut Delivery, defect: Defect| {
            d.defect.get_or_insert(defect);
        };
        let pairs = flat.chunks_exact(2);
        if !pairs.remainder().is_empty() {
            found(&mut d, Defect::Malformed);
        }
        for pair in pairs {
            let (name, value) = (pair[0], pair[1]);
            let Ok(name) = std::str::from_utf8(name) else {
                found(&mut d, Defect::NameNotUtf8(untrusted::lossy(name)));
                continue;
            };
            let place = match name {
                "slot" => &mut d.slot,
                "caller" => &mut d.caller,
                "enqueued_at" => &mut d.enqueued_at,
                crate::slot::EARLY_FIELD => &mut d.early,
                _ => {
                    found(&mut d, Defect::UnknownField(untrusted::truncate(name)));
                    continue;
                }
            };
            if place.is_some() {
                found(&mut d, Defect::RepeatedField(name.to_owned()));
                continue;
            }
            let too_long = name == "slot" && value.len() > MAX_SLOT_BYTES;
            *place = Some(untrusted::lossy(value));
            if too_long {
                found(&mut d, Defect::SlotTooLong(value.len()));
            } else if std::str::from_utf8(value).is_err() {
                found(&mut d, Defect::ValueNotUtf8(name.to_owned()));
            }
        }
        d
    }
}

/// The bytes of a string reply.
pub(super) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod partition_tests {
    use super::*;

    /// Two partitions' streams hand out the same id in the same
    /// millisecond: recorded apart (the execution table keeps one row per
    /// recorded id), acknowledged each in its own stream by the stream's id.
    #[test]
    fn equal_stream_ids_of_two_partitions_are_recorded_apart() {
        let d = |p| {
            Delivery::synthetic("1796379690376-0".into(), "a:2026-12-04:1", "planner")
                .in_partition(p)
        };
        let (zero, one, two) = (d(0), d(1), d(2));
        assert_eq!(zero.entry_id, "1796379690376-0");
        assert_eq!(one.entry_id, "1796379690376-0@1");
        assert_ne!(one.entry_id, two.entry_id);
        for x in [&zero, &one, &two] {
            assert_eq!(x.entry().id, "1796379690376-0");
            assert_eq!(x.entry().partition, x.partition);
        }
        assert_eq!(recorded_entry_id("5-1", 3), "5-1@3");
        assert_eq!(EntryRef::recorded(3, "5-1@3").id, "5-1");
    }
}
