//! Seeded webhook faults for the stand-in CMS, and the "answer the next
//! publish call like this" hook (held open to kill a worker mid-webhook,
//! redirected, answered just past the timeout, applied only after a hold).
//! Probes (`--cms probe`) are never faulted: the CMS answers them by the
//! probe contract.

use crate::model::Fault;
use crate::scenario::{WebhookRates, HTTP_TIMEOUT_MS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::cms::{Chooser, Reply};
use tokio::sync::oneshot;

/// One faulty (or slow) answer the CMS gave.
#[derive(Debug, Clone)]
pub struct Injected {
    pub fault: Fault,
    /// The idempotency key as sent.
    pub key: String,
}

struct State {
    rng: StdRng,
    rates: WebhookRates,
    failures: HashMap<String, u32>,
    log: Vec<Injected>,
    /// Armed answers for the next publish calls, oldest first: (id, the
    /// answer, where to send the call's key).
    holds: VecDeque<(u64, Reply, oneshot::Sender<String>)>,
    next_hold: u64,
}

#[derive(Clone)]
pub struct WebhookChaos {
    state: Arc<Mutex<State>>,
}

impl WebhookChaos {
    pub fn new(seed: u64, rates: WebhookRates) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                rng: StdRng::seed_from_u64(seed ^ 0x5eed_cafe_f00d_0001),
                rates,
                failures: HashMap::new(),
                log: Vec::new(),
                holds: VecDeque::new(),
                next_hold: 0,
            })),
        }
    }

    pub fn chooser(&self) -> Chooser {
        let this = self.clone();
        Arc::new(move |path: &str, key: Option<&str>, _body: &Value| this.choose(path, key))
    }

    fn choose(&self, path: &str, key: Option<&str>) -> Option<Reply> {
        // A probe (`--cms probe`) gets the CMS's own answer, by the
        // contract: a random answer here would be a 200 that is not the
        // truth, or a failure the probe's own backoff already covers.
        // Drawn from nothing, so the publish calls' draws are unchanged.
        if path.starts_with("/probe") {
            return None;
        }
        let mut g = self.state.lock().unwrap();
        let key = key.unwrap_or("").to_owned();
        if path == "/publish" {
            if let Some((_, reply, tx)) = g.holds.pop_front() {
                let _ = tx.send(key);
                return Some(reply);
            }
        }
        let r = g.rates;
        let x: f64 = g.rng.gen();
        let fk = format!("{path} {key}");
        let failing = *g.failures.get(&fk).unwrap_or(&0) < r.max_failures_per_key;
        let (fault, reply) = if x < r.p503 {
            (Fault::Webhook503, Reply::Status(503))
        } else if x < r.p503 + r.timeout {
            let ms = g
                .rng
                .gen_range(HTTP_TIMEOUT_MS + 300..=HTTP_TIMEOUT_MS * 5 / 2);
            (
                Fault::WebhookTimeout,
                Reply::Delay(Duration::from_millis(ms), 200),
            )
        } else if x < r.p503 + r.timeout + r.reset {
            (Fault::WebhookReset, Reply::Reset)
        } else if x < r.p503 + r.timeout + r.reset + r.slow {
            let ms = g.rng.gen_range(150..=HTTP_TIMEOUT_MS * 6 / 10);
            let log = Injected {
                fault: Fault::WebhookSlow,
                key,
            };
            g.log.push(log);
            return Some(Reply::Delay(Duration::from_millis(ms), 200));
        } else {
            return None;
        };
        if !failing {
            return None;
        }
        *g.failures.entry(fk).or_default() += 1;
        g.log.push(Injected { fault, key });
        Some(reply)
    }

    /// A coming publish call (one per armed answer, in order) is answered
    /// with `reply`; its idempotency key arrives on the receiver when it
    /// comes in. Returns the arming's id for [`Self::disarm_hold`].
    pub fn arm(&self, reply: Reply) -> (u64, oneshot::Receiver<String>) {
        let (tx, rx) = oneshot::channel();
        let mut g = self.state.lock().unwrap();
        let id = g.next_hold;
        g.next_hold += 1;
        g.holds.push_back((id, reply, tx));
        (id, rx)
    }

    /// Withdraws a hold that no call took.
    pub fn disarm_hold(&self, id: u64) {
        self.state
            .lock()
            .unwrap()
            .holds
            .retain(|(i, _, _)| *i != id);
    }

    pub fn log(&self) -> Vec<Injected> {
        self.state.lock().unwrap().log.clone()
    }
}
