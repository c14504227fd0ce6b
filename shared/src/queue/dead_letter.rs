//! `P:dead`: deliveries that can never succeed, kept (capped) for an
//! operator to replay or purge. Each partition keeps its own (a dead
//! letter is written in the same step that acknowledges its entry, so it
//! must share the entry's hash slot); listings merge them.

use super::*;

/// A dead letter as stored in `P:dead`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its entry id in `P:dead`, which replay and purge name.
    pub id: String,
    /// The partition whose `P:dead` holds it (0 in the default layout).
    pub partition: u16,
    /// The delivery's own fields (bounded copies) plus slotgate's
    /// `reason`, `entry_id`, `deliveries` and `dead_at`.
    pub fields: HashMap<String, String>,
}

impl Queue {
    /// Moves an entry to `P:dead` with a reason, and acknowledges it, in one
    /// script. The dead letter keeps only the delivery's own fields (bounded
    /// copies) and slotgate's `reason`, `entry_id`, `deliveries`, `dead_at`;
    /// `P:dead` is capped (see [`Queue::with_dead_letter_cap`]).
    pub async fn dead_letter(
        &self,
        d: &Delivery,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), QueueError> {
        let part = self.keys.part(d.partition);
        let mut inv = self.scripts.dead.prepare_invoke();
        inv.key(part.dead())
            .key(part.ready())
            .arg(GROUP)
            .arg(self.dead_cap)
            .arg(d.entry().id);
        for (name, value) in [
            ("slot", d.slot()),
            ("caller", d.caller.as_deref()),
            ("enqueued_at", d.enqueued_at()),
        ] {
            if let Some(v) = value {
                inv.arg(name).arg(v);
            }
        }
        inv.arg("reason")
            .arg(reason)
            .arg("entry_id")
            .arg(&d.entry_id)
            .arg("deliveries")
            .arg(d.deliveries)
            .arg("dead_at")
            .arg(now_ms);
        let aside: String = self.invoke("dead letter", &inv).await?;
        self.repaired("dead letter", &aside);
        Ok(())
    }

    /// Every dead letter (oldest first), up to `limit`.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        self.dead_range(["XRANGE dead", "XRANGE", "-", "+"], limit)
            .await
    }

    /// Dead letters newest first, up to `limit`: what an operator looks at.
    pub async fn newest_dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        self.dead_range(["XREVRANGE dead", "XREVRANGE", "+", "-"], limit)
            .await
    }

    /// Deletes one dead letter, by its partition and its id there;
    /// whether it was there.
    pub async fn delete_dead_letter(&self, partition: u16, id: &str) -> Result<bool, QueueError> {
        if partition >= self.keys.partitions() {
            return Ok(false);
        }
        let mut cmd = redis::cmd("XDEL");
        cmd.arg(self.keys.part(partition).dead()).arg(id);
        let n: i64 = self.query("XDEL dead", &cmd).await?;
        Ok(n > 0)
    }

    /// Deletes the dead letters added before `cutoff_ms` (Unix ms, the
    /// stream id's time) from every partition; returns how many.
    pub async fn purge_dead_letters_before(&self, cutoff_ms: i64) -> Result<u64, QueueError> {
        let mut n = 0;
        for (_, part) in self.keys.parts() {
            let mut cmd = redis::cmd("XTRIM");
            cmd.arg(part.dead()).arg("MINID").arg(cutoff_ms.max(0));
            n += self.query::<u64>("XTRIM dead", &cmd).await?;
        }
        Ok(n)
    }

    /// Reads up to `limit` dead letters of every partition: `[what,
    /// command, from, to]` names the call and is `XRANGE - +` (oldest
    /// first) or `XREVRANGE + -` (newest first). Partitions are merged by
    /// the ids' time, the order kept.
    async fn dead_range(
        &self,
        [what, command, from, to]: [&'static str; 4],
        limit: usize,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let mut all = Vec::new();
        for (p, part) in self.keys.parts() {
            let page = self
                .range(what, &part.dead(), [command, from, to], limit, |e| {
                    e.flat
                        .chunks_exact(2)
                        .map(|f| (untrusted::lossy(f[0]), untrusted::lossy(f[1])))
                        .collect()
                })
                .await?;
            all.extend(page.into_iter().map(|(id, fields)| DeadLetter {
                id,
                partition: p,
                fields,
            }));
        }
        if self.keys.partitions() > 1 {
            let time = |d: &DeadLetter| {
                let (ms, seq) = d.id.split_once('-').unwrap_or((&d.id, "0"));
                (
                    ms.parse::<u64>().unwrap_or(0),
                    seq.parse::<u64>().unwrap_or(0),
                )
            };
            all.sort_by_key(time);
            if command == "XREVRANGE" {
                all.reverse();
            }
            all.truncate(limit);
        }
        Ok(all)
    }
}
