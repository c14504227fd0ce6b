//! [`KeySpace`]: the name of every Redis key under one prefix, built in
//! one place so no caller spells a key by hand.

/// The names of every key under one prefix. (One Redis primary at one
/// address; Redis Cluster is not supported, see docs/DESIGN.md 4.4.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// The keys under `prefix`; tests give each run its own prefix so
    /// they never see each other's keys.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }
    /// The prefix (`P` in `P:ready`, `P:dead`, …).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// Sorted set of planned slots not yet due: member = slot key, score = due ms.
    pub fn delayed(&self) -> String {
        format!("{}:delayed", self.prefix)
    }
    /// Stream of deliveries, consumed by group [`GROUP`](super::GROUP).
    pub fn ready(&self) -> String {
        format!("{}:ready", self.prefix)
    }
    /// A one-entry stream rung after every add to [`KeySpace::ready`]:
    /// workers block on it, so a wait never hands them an entry's bytes.
    pub fn bell(&self) -> String {
        format!("{}:ready:bell", self.prefix)
    }
    /// The leader lease: `<worker id>:<epoch>` with a TTL.
    pub fn leader(&self) -> String {
        format!("{}:leader", self.prefix)
    }
    /// Mirror of the current fencing epoch (the counter lives in Postgres).
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }
    /// Stream of dead letters, each with a `reason`.
    pub fn dead(&self) -> String {
        format!("{}:dead", self.prefix)
    }
    /// Hash of live workers: worker id → last heartbeat (Unix ms).
    pub fn workers(&self) -> String {
        format!("{}:workers", self.prefix)
    }
    /// Pattern matching every key of this prefix (for tests and tooling).
    pub fn pattern(&self) -> String {
        format!("{}:*", self.prefix)
    }
}
