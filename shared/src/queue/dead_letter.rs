//! `P:dead`: deliveries that can never succeed, kept (capped) for an
//! operator to replay or purge.

use super::*;

/// A dead letter as stored in `P:dead`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its entry id in `P:dead`, which replay and purge name.
    pub id: String,
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
        let mut inv = self.scripts.dead.prepare_invoke();
        inv.key(self.keys.dead())
            .key(self.keys.ready())
            .arg(GROUP)
            .arg(self.dead_cap)
            .arg(&d.entry_id);
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

    /// Deletes one dead letter by its id; whether it was there.
    pub async fn delete_dead_letter(&self, id: &str) -> Result<bool, QueueError> {
        let mut cmd = redis::cmd("XDEL");
        cmd.arg(self.keys.dead()).arg(id);
        let n: i64 = self.query("XDEL dead", &cmd).await?;
        Ok(n > 0)
    }

    /// Deletes the dead letters added before `cutoff_ms` (Unix ms, the
    /// stream id's time); returns how many.
    pub async fn purge_dead_letters_before(&self, cutoff_ms: i64) -> Result<u64, QueueError> {
        let mut cmd = redis::cmd("XTRIM");
        cmd.arg(self.keys.dead()).arg("MINID").arg(cutoff_ms.max(0));
        self.query("XTRIM dead", &cmd).await
    }
}
