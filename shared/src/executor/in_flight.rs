//! One delivery per slot per process: the slots this worker is handling
//! right now, so a second copy of a slot's delivery waits its turn instead
//! of meeting its own worker's claim.

use crate::slot::SlotKey;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The slots this process is handling right now: one delivery per slot at a
/// time. A delivery takes its slot here before the gate and keeps it until
/// its outcome is committed (or it gives up); a second delivery of the same
/// slot meanwhile (a reclaimed copy, a redelivery) waits its turn
/// ([`ExecError::Busy`](super::ExecError::Busy)) instead of meeting its own worker's claim and
/// mistaking it for a duplicate.
///
/// Holding the slot also tells the gate that a live claim under this
/// worker's id was *not* made by this process: it was left by an earlier
/// run under the same id, and is resumed at once.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<SlotKey>>>);

impl InFlight {
    pub(super) fn try_hold(&self, key: &SlotKey) -> Option<Held> {
        let mut set = self.0.lock().expect("in-flight set poisoned");
        set.insert(key.clone()).then(|| Held {
            set: self.clone(),
            key: key.clone(),
        })
    }
}

/// A slot held in [`InFlight`]; released when dropped (also when a
/// delivery's future is dropped half-way).
#[derive(Debug)]
pub(super) struct Held {
    set: InFlight,
    key: SlotKey,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.0.lock() {
            set.remove(&self.key);
        }
    }
}
