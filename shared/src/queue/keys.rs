//! [`KeySpace`]: the name of every Redis key under one prefix, built in
//! one place so no caller spells a key by hand, and the partition a slot's
//! keys live in ([`KeySpace::partition_of`]).
//!
//! **Partitions** (`redis_partitions = N` in the config) spread the queue
//! over a Redis Cluster's shards: each partition has its own delayed set,
//! stream, bell, dead letters and fence, all under one hash tag
//! (`{P:p}:…`), so every script still touches a single hash slot. What is
//! global (the leader lease, its epoch mirror, the worker heartbeats) lives
//! under `{P}:…`.
//!
//! Which shard a tag lands on is the CRC16 of the tag, and three tags can
//! easily land on one shard of three. So partition `p`'s tag is `P:p`, or
//! `P:p:k` with the smallest `k` that puts it in the `p`-th of `N` equal
//! ranges of the 16,384 hash slots: `redis-cli --cluster create` deals the
//! slots to masters in equal ranges, so with `N` = the number of masters
//! (or a multiple) every master gets its share of partitions.
//!
//! The default layout — one partition on a standalone or Sentinel Redis —
//! keeps the names slotgate always used (`P:delayed`, `P:ready`, …), so
//! existing deployments and `redis-cli` habits carry on. A Cluster always
//! uses the tagged names (without a tag the scripts' keys would hash to
//! different slots and Redis would refuse them with `CROSSSLOT`).

use crate::config::MAX_PARTITIONS;

/// Where `stream.lua` moves a stream Redis refuses to add to (its last
/// possible id used, or the key holds another type): `<stream>:broken:<unix
/// ms>`, kept for inspection. This names the rule on Rust's side; the
/// script spells it once on its own.
const ASIDE: &str = ":broken:";

/// The glob matching every name `stream` was moved aside to.
pub fn aside_glob(stream: &str) -> String {
    format!("{stream}{ASIDE}*")
}

/// The stream a moved-aside name came from (`aside` itself when it is not
/// one).
pub(super) fn aside_of(aside: &str) -> &str {
    aside.split(ASIDE).next().unwrap_or(aside)
}

/// The names of every key under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
    partitions: u16,
    tagged: bool,
    /// Each partition's hash tag (tagged layouts only).
    tags: Vec<String>,
}

/// The keys of one partition: every key a script touches together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionKeys {
    base: String,
    fence: Option<String>,
}

impl PartitionKeys {
    /// Sorted set of planned slots not yet due: member = slot key, score = due ms.
    pub fn delayed(&self) -> String {
        format!("{}:delayed", self.base)
    }
    /// Stream of deliveries, consumed by group [`GROUP`](super::GROUP).
    pub fn ready(&self) -> String {
        format!("{}:ready", self.base)
    }
    /// A one-entry stream rung after every add to [`PartitionKeys::ready`]:
    /// workers block on it, so a wait never hands them an entry's bytes.
    pub fn bell(&self) -> String {
        format!("{}:ready:bell", self.base)
    }
    /// Stream of dead letters, each with a `reason`.
    pub fn dead(&self) -> String {
        format!("{}:dead", self.base)
    }
    /// The key `promote.lua` checks the leader's fence against: the lease
    /// itself in the default layout, else a copy of it in this partition's
    /// hash slot that the leader keeps ([`Lease`](crate::lease::Lease)).
    pub fn fence(&self) -> String {
        self.fence
            .clone()
            .unwrap_or_else(|| format!("{}:leader", self.base))
    }
}

impl KeySpace {
    /// The keys under `prefix` in the default layout (one partition, the
    /// names slotgate always used); tests give each run its own prefix so
    /// they never see each other's keys.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self::partitioned(prefix, 1, false)
    }

    /// The keys under `prefix` over `partitions` partitions (clamped to
    /// 1..=[`MAX_PARTITIONS`]); `cluster` forces the hash-tagged names even
    /// for one partition.
    pub fn partitioned(prefix: impl Into<String>, partitions: u16, cluster: bool) -> Self {
        let prefix = prefix.into();
        let partitions = partitions.clamp(1, MAX_PARTITIONS);
        let tagged = cluster || partitions > 1;
        let tags = match tagged {
            false => Vec::new(),
            true => (0..partitions)
                .map(|p| spread_tag(&prefix, p, partitions))
                .collect(),
        };
        Self {
            prefix,
            partitions,
            tagged,
            tags,
        }
    }

    /// The prefix (`P` in `P:ready`, `{P:0}:ready`, …).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many partitions the queue is spread over.
    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// Whether keys carry hash tags (more than one partition, or a Cluster).
    pub fn tagged(&self) -> bool {
        self.tagged
    }

    /// The keys of partition `p` (`p < partitions()`).
    pub fn part(&self, p: u16) -> PartitionKeys {
        debug_assert!(p < self.partitions);
        if self.tagged {
            PartitionKeys {
                base: format!("{{{}}}", self.tags[p as usize]),
                fence: None,
            }
        } else {
            PartitionKeys {
                base: self.prefix.clone(),
                // The default layout checks the lease itself.
                fence: Some(self.leader()),
            }
        }
    }

    /// The partition a slot key is queued in: FNV-1a (64-bit) of the key,
    /// modulo the partition count. By key rather than by kind, so that one
    /// busy kind spreads over every shard too; nothing depends on where a
    /// slot is (workers read every partition and the gate decides), so an
    /// entry added by hand to any partition is delivered all the same.
    pub fn partition_of(&self, slot_key: &str) -> u16 {
        if self.partitions == 1 {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in slot_key.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h % u64::from(self.partitions)) as u16
    }

    /// Every partition's keys, in order.
    pub fn parts(&self) -> impl Iterator<Item = (u16, PartitionKeys)> + '_ {
        (0..self.partitions).map(|p| (p, self.part(p)))
    }

    fn global(&self, name: &str) -> String {
        if self.tagged {
            format!("{{{}}}:{name}", self.prefix)
        } else {
            format!("{}:{name}", self.prefix)
        }
    }

    /// The only partition's delayed set in the default layout (partition
    /// 0's otherwise).
    pub fn delayed(&self) -> String {
        self.part(0).delayed()
    }
    /// The only partition's stream in the default layout (partition 0's
    /// otherwise).
    pub fn ready(&self) -> String {
        self.part(0).ready()
    }
    /// The only partition's bell in the default layout (partition 0's
    /// otherwise).
    pub fn bell(&self) -> String {
        self.part(0).bell()
    }
    /// The only partition's dead letters in the default layout (partition
    /// 0's otherwise).
    pub fn dead(&self) -> String {
        self.part(0).dead()
    }
    /// The leader lease: `<worker id>:<epoch>` with a TTL.
    pub fn leader(&self) -> String {
        self.global("leader")
    }
    /// Mirror of the current fencing epoch (the counter lives in Postgres).
    pub fn epoch(&self) -> String {
        self.global("epoch")
    }
    /// Hash of live workers: worker id → last heartbeat (Unix ms).
    pub fn workers(&self) -> String {
        self.global("workers")
    }
}

/// Partition `p`'s hash tag: `prefix:p`, or `prefix:p:k` with the
/// smallest `k` whose hash slot is in the `p`-th of `n` equal ranges (see
/// the module overview). A range of 16384/64 = 256 slots is hit within a
/// few hundred tries; past 100,000 the plain tag is kept.
fn spread_tag(prefix: &str, p: u16, n: u16) -> String {
    let plain = format!("{prefix}:{p}");
    let range = |slot: u16| (u32::from(slot) * u32::from(n) / 16384) as u16;
    if n == 1 || range(hash_slot(&plain)) == p {
        return plain;
    }
    (0..100_000u32)
        .map(|k| format!("{plain}:{k}"))
        .find(|t| range(hash_slot(t)) == p)
        .unwrap_or(plain)
}

/// Redis Cluster's hash slot of a tag: CRC16 (XMODEM) modulo 16384.
fn hash_slot(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for b in tag.bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_layout_keeps_its_names() {
        let k = KeySpace::new("sg");
        assert_eq!(
            [
                k.delayed(),
                k.ready(),
                k.bell(),
                k.dead(),
                k.leader(),
                k.epoch(),
                k.workers()
            ],
            [
                "sg:delayed",
                "sg:ready",
                "sg:ready:bell",
                "sg:dead",
                "sg:leader",
                "sg:epoch",
                "sg:workers"
            ]
        );
        assert_eq!(k.part(0).fence(), "sg:leader");
        assert_eq!(k.partition_of("2026-12-04:1:article"), 0);
    }

    #[test]
    fn partitions_share_a_hash_tag_each() {
        let k = KeySpace::partitioned("sg", 3, true);
        let p = k.part(2);
        let t = &k.tags[2];
        assert!(t.starts_with("sg:2"), "{t}");
        assert_eq!(
            [p.delayed(), p.ready(), p.bell(), p.dead(), p.fence()],
            ["delayed", "ready", "ready:bell", "dead", "leader"].map(|n| format!("{{{t}}}:{n}"))
        );
        assert_eq!([k.leader(), k.epoch()], ["{sg}:leader", "{sg}:epoch"]);
        // A Cluster with one partition still tags its keys.
        assert_eq!(KeySpace::partitioned("sg", 1, true).ready(), "{sg:0}:ready");
    }

    #[test]
    fn partition_tags_fall_in_equal_ranges_of_the_hash_slots() {
        // Redis's own examples: CLUSTER KEYSLOT of these.
        assert_eq!(hash_slot("foo"), 12182);
        assert_eq!(hash_slot("123456789"), 0x31c3);
        for n in [2u16, 3, 6, 10, 64] {
            let k = KeySpace::partitioned("slotgate", n, true);
            for p in 0..n {
                let slot = u32::from(hash_slot(&k.tags[p as usize]));
                assert_eq!((slot * u32::from(n) / 16384) as u16, p, "n={n} p={p}");
            }
        }
    }

    #[test]
    fn slots_spread_over_partitions_stably() {
        let k = KeySpace::partitioned("sg", 3, false);
        let mut counts = [0u32; 3];
        for s in 1..=3000 {
            let key = format!("2026-12-04:{s}:article");
            let p = k.partition_of(&key);
            assert_eq!(p, k.partition_of(&key));
            counts[p as usize] += 1;
        }
        // One kind's slots spread over every partition, within 10 %.
        assert!(
            counts.iter().all(|c| (900..=1100).contains(c)),
            "{counts:?}"
        );
    }
}
