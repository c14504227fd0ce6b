//! The worker's call permits: at most `concurrency × batch` webhook calls
//! in flight, each permit held from before its slot's gate until its call
//! returns, and a share per kind, so that a CMS that answers slowly (or
//! not at all before its timeout) slows its own kind only.
//!
//! Without the share, a kind whose every call is slow took more of the
//! permits with every read, since its slots come back in every read while
//! its calls do not return; once its calls held them all, every kind's
//! slots waited unread. With it, a kind holds at most [`Calls::share`]
//! permits; a slot of a kind at its share waits in intake outside any
//! permit (its entry kept alive) and is gated, before any new read, as
//! soon as its kind's calls leave room.
//!
//! And the last permits are kept for CMSs that hold few calls: once the
//! calls open leave only a foothold's worth ([`Calls::foothold`], a
//! quarter of the permits above the share: 8 of 256 by default), a kind
//! may open more only while its CMS ([`KindConfig::cms`], the origin it
//! publishes to) has fewer than that many open. So two CMSs that hang
//! cannot take every permit between them (with a share per kind alone
//! they did, and every other kind waited for their timeouts); a third
//! CMS's kinds always find its foothold. Per CMS, not per kind: the kinds
//! of one site hang together when it hangs, and with a foothold each,
//! three of them took the last permits. A share of all kinds together
//! (224) kept more back, but cut a fast ten-kind burst by a fifth: its
//! slots waited in intake for room they would have had in milliseconds.
//!
//! [`KindConfig::cms`]: crate::config::KindConfig::cms
//!
//! A read admits no more calls than permits are free: a slot admitted
//! beyond them would wait for one in [`Calls::take`], and intake with it,
//! so every kind (record-only ones too, which take no permit) would wait
//! for calls that may hang until their timeouts. With three or more CMSs
//! that hang, their footholds can take the last permits; then the
//! other kinds' webhook slots wait in intake like those of a kind at its
//! share, and every other slot goes on being read and gated.
//!
//! (Held back on a timer instead — 200 ms, later 5 ms while the kind's
//! calls were returning — the slots of a burst of one kind came back in
//! dribs, piled up to the worker's bound of held deliveries, and the burst
//! ran at a fifth, then about half, of its rate before the shares:
//! docs/benchmarks-archive.md, 2026-12-07.)

use super::*;
use tokio::sync::OwnedSemaphorePermit;

/// The call permits of one worker and the calls each kind has open.
pub(super) struct Calls {
    sem: Arc<Semaphore>,
    total: usize,
    batch: usize,
    /// Per kind, the calls open (kept at zero: a worker has as many
    /// entries as its config has kinds).
    open: Arc<Mutex<HashMap<String, usize>>>,
    /// Per kind that calls, the CMS it calls ([`KindConfig::cms`]): the
    /// footholds are kept per CMS.
    ///
    /// [`KindConfig::cms`]: crate::config::KindConfig::cms
    cms: Arc<HashMap<String, String>>,
}

/// One webhook slot's call permit, taken before its gate. Dropped when
/// its call returns (or when the gate decided the slot without a call),
/// which gives the permit back and lowers its kind's count.
pub(super) struct CallPermit {
    _permit: OwnedSemaphorePermit,
    kind: String,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().expect("open calls poisoned");
        if let Some(n) = open.get_mut(&self.kind) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Calls {
    /// `concurrency × batch` permits (see [`WorkerOptions::batch`]) for the
    /// kinds of `config`.
    pub(super) fn new(opts: &WorkerOptions, config: &Config) -> Calls {
        let total = opts.concurrency.max(1) * opts.batch.max(1);
        let cms = (config.kinds.iter())
            .filter_map(|k| Some((k.name.clone(), k.cms()?)))
            .collect();
        Calls {
            sem: Arc::new(Semaphore::new(total)),
            total,
            batch: opts.batch.max(1),
            open: Default::default(),
            cms: Arc::new(cms),
        }
    }

    /// All the permits there are.
    pub(super) fn total(&self) -> usize {
        self.total
    }

    /// Permits free now.
    pub(super) fn free(&self) -> usize {
        self.sem.available_permits()
    }

    /// Waits until `n` permits (at most all there are) are free at once.
    pub(super) async fn wait_free(&self, n: usize) {
        let n = n.clamp(1, self.total) as u32;
        let _ = self.sem.acquire_many(n).await;
    }

    /// The most calls one kind may have open: all but a read's worth
    /// (`batch`), so the other kinds can always gate a read, or half of
    /// them when a read's worth is more than half (`--concurrency 1`).
    pub(super) fn share(&self) -> usize {
        (self.total - self.batch.min(self.total))
            .max(self.total.div_ceil(2))
            .max(1)
    }

    /// How many calls the kinds of one CMS may have open even when all
    /// kinds' calls leave only this many permits free: a quarter of the
    /// permits above the share (8 of those 32 by default), at least one. A
    /// CMS's kinds take its foothold only while a permit is free
    /// ([`Tally::room`]); with three or more CMSs whose calls hang, their
    /// footholds may take the last.
    pub(super) fn foothold(&self) -> usize {
        ((self.total - self.share()) / 4).max(1)
    }

    /// How many free permits a read of webhook slots waits for: a read's
    /// worth (`batch`), or what one kind's share leaves the others when
    /// that is less (`--concurrency 1`), so a kind at its share never
    /// keeps the others from reading.
    pub(super) fn enough_to_read(&self) -> usize {
        self.batch.min(self.total - self.share()).max(1)
    }

    /// How many free permits intake waits for when slots wait for their
    /// kinds' calls and the last read brought nothing else: what a kind
    /// at its share leaves free, plus a read's worth. With one kind at its
    /// share, that many of its calls have then returned, and a gate's worth
    /// of its waiting slots fits.
    pub(super) fn enough_to_resume(&self) -> usize {
        (self.total - self.share() + self.enough_to_read()).min(self.total)
    }

    /// A tally of a read's webhook slots against their kinds' shares,
    /// starting from the calls each kind has open now (one look for the
    /// whole read: only intake takes permits, so the counts can only have
    /// fallen by the time the read's groups take theirs).
    pub(super) fn tally(&self) -> Tally {
        let counts = self.open.lock().expect("open calls poisoned").clone();
        let mut at_cms: HashMap<String, usize> = HashMap::new();
        for (kind, n) in &counts {
            *at_cms
                .entry(cms_of(&self.cms, kind).to_owned())
                .or_default() += n;
        }
        Tally {
            share: self.share(),
            foothold: self.foothold(),
            counts,
            at_cms,
            cms: self.cms.clone(),
            free: self.free(),
        }
    }

    /// Takes a call permit for each webhook slot of a group (`Some(kind)`
    /// beside it; `None` beside a slot that calls no one), waiting until
    /// they are free → the permits, beside the slots they belong to.
    pub(super) async fn take(&self, kinds: Vec<Option<String>>) -> Vec<Option<CallPermit>> {
        let n = kinds.iter().flatten().count().min(self.total);
        if n == 0 {
            return kinds.iter().map(|_| None).collect();
        }
        let mut all = self
            .sem
            .clone()
            .acquire_many_owned(n as u32)
            .await
            .expect("semaphore never closed");
        let mut permits: Vec<OwnedSemaphorePermit> = (1..n).filter_map(|_| all.split(1)).collect();
        permits.push(all);
        let mut permits = permits.into_iter();
        let mut open = self.open.lock().expect("open calls poisoned");
        kinds
            .into_iter()
            .map(|kind| {
                let kind = kind?;
                let permit = permits.next()?;
                *open.entry(kind.clone()).or_default() += 1;
                Some(CallPermit {
                    _permit: permit,
                    kind,
                    open: self.open.clone(),
                })
            })
            .collect()
    }
}

/// The CMS `kind` calls; a kind the config does not name (none reaches
/// here: only a valid delivery is batched) is a CMS of its own.
fn cms_of<'a>(cms: &'a HashMap<String, String>, kind: &'a str) -> &'a str {
    cms.get(kind).map_or(kind, String::as_str)
}

/// A read's webhook slots counted against their kinds' shares and the
/// permits free, beside the calls each kind had open when the read was
/// tallied.
pub(super) struct Tally {
    share: usize,
    foothold: usize,
    /// Per kind: calls open plus the read's slots admitted so far.
    counts: HashMap<String, usize>,
    /// The same per CMS: the sum over its kinds.
    at_cms: HashMap<String, usize>,
    cms: Arc<HashMap<String, String>>,
    /// Permits free when the read was tallied, less the read's slots
    /// admitted so far: what all kinds together may still open. Only
    /// intake takes permits, so each slot admitted finds its permit free
    /// in [`Calls::take`].
    free: usize,
}

impl Tally {
    /// How many more calls of `kind` fit: below its share, and within the
    /// free permits but a foothold's worth (all kinds together) or else
    /// its CMS's foothold; never more than are free (see the module doc).
    pub(super) fn room(&self, kind: &str) -> usize {
        let n = self.counts.get(kind).copied().unwrap_or(0);
        let at_cms = (self.at_cms.get(cms_of(&self.cms, kind)))
            .copied()
            .unwrap_or(0);
        let together =
            (self.free.saturating_sub(self.foothold)).max(self.foothold.saturating_sub(at_cms));
        together.min(self.share.saturating_sub(n)).min(self.free)
    }

    /// Whether a call of `kind` fits ([`Tally::room`]); if it does, it is
    /// counted.
    pub(super) fn admit(&mut self, kind: &str) -> bool {
        if self.room(kind) == 0 {
            return false;
        }
        count(&mut self.counts, kind);
        count(&mut self.at_cms, cms_of(&self.cms, kind));
        self.free -= 1;
        true
    }
}

/// One more for `key` in `counts`: a key already there (a kind or CMS with
/// calls open) is counted without a new `String` per slot admitted.
fn count(counts: &mut HashMap<String, usize>, key: &str) {
    match counts.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            counts.insert(key.to_owned(), 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(concurrency: usize, batch: usize) -> Calls {
        calls_to(concurrency, batch, &[])
    }

    /// [`calls`] for a config whose kinds `kinds` (name, CMS) publish to
    /// webhooks; a kind it does not name is a CMS of its own.
    fn calls_to(concurrency: usize, batch: usize, kinds: &[(&str, &str)]) -> Calls {
        let mut opts = WorkerOptions::new("t");
        opts.concurrency = concurrency;
        opts.batch = batch;
        let kind = |name: &str, extra: &str| {
            format!("[[kinds]]\nname = \"{name}\"\ntimezone = \"UTC\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n{extra}\n")
        };
        let text: String = std::iter::once(kind("record", ""))
            .chain(
                (kinds.iter())
                    .map(|(k, cms)| kind(k, &format!("publish_url = \"{cms}/publish/{k}\""))),
            )
            .collect();
        let config = Config::parse(std::path::Path::new("t.toml"), &text).expect("a valid config");
        Calls::new(&opts, &config)
    }

    #[test]
    fn a_kind_leaves_the_others_a_reads_worth_or_half() {
        assert_eq!((calls(8, 32).total(), calls(8, 32).share()), (256, 224));
        assert_eq!(calls(2, 4).share(), 4);
        assert_eq!(calls(1, 32).share(), 16);
        assert_eq!(calls(1, 1).share(), 1);
        // What a read waits for never exceeds what a kind at its share
        // leaves free.
        for (c, b) in [(8, 32), (2, 4), (1, 32), (1, 1), (3, 5), (1024, 1)] {
            let k = calls(c, b);
            assert!(
                k.enough_to_read() <= (k.total() - k.share()).max(1),
                "{c} x {b}"
            );
        }
        assert_eq!(calls(8, 32).enough_to_read(), 32);
        assert_eq!(calls(8, 32).enough_to_resume(), 64);
        assert_eq!(calls(1, 32).enough_to_resume(), 32);
        assert_eq!(calls(1, 1).enough_to_resume(), 1);
        assert_eq!(calls(1, 32).enough_to_read(), 16);
        assert_eq!(
            (
                calls(8, 32).foothold(),
                calls(2, 4).foothold(),
                calls(1, 1).foothold()
            ),
            (8, 1, 1)
        );
    }

    #[tokio::test]
    async fn the_last_permits_are_kept_for_kinds_that_hold_few_calls() {
        // 256 permits, share 224, foothold 8: kinds together hold at most
        // 248 but for footholds.
        let c = calls(8, 32);
        let a = c.take(vec![Some("a".to_owned()); 224]).await;
        let b = c.take(vec![Some("b".to_owned()); 24]).await;
        let mut t = c.tally();
        // `a` at its share; `b` above its foothold with all but eight
        // permits taken; a kind with none open may open eight.
        assert_eq!((t.room("a"), t.room("b"), t.room("c")), (0, 0, 8));
        for _ in 0..8 {
            assert!(t.admit("c"));
        }
        assert!(!t.admit("c"), "c is at its foothold");
        assert_eq!(
            t.room("d"),
            0,
            "c's slots of this read take the last free permits"
        );
        drop(t);
        // With none of those slots taken, d has a foothold of its own.
        assert_eq!(c.tally().room("d"), 8);
        // Three kinds hold every permit: a fourth's foothold is not
        // admitted (it would wait in `take`, and intake with it).
        let cs = c.take(vec![Some("c".to_owned()); 8]).await;
        assert_eq!(c.free(), 0);
        assert_eq!(c.tally().room("d"), 0);
        drop(cs);
        // Calls of `a` return: room again, for any kind.
        drop(a);
        let mut t = c.tally();
        assert_eq!((t.room("a"), t.room("b")), (224, 200));
        assert!(t.admit("b"));
        assert_eq!(t.room("a"), 223, "the read's own slot counts for all kinds");
        drop((t, b));
        // One kind alone: its share, as before.
        let mut t = c.tally();
        assert_eq!(t.room("a"), 224);
        for _ in 0..224 {
            assert!(t.admit("a"));
        }
        assert!(!t.admit("a"));
        assert_eq!(t.room("z"), 24);
    }

    /// The footholds are per CMS: kinds that share one (a site with
    /// several kinds) and hang together take one foothold between them,
    /// and the kinds of another CMS find theirs.
    #[tokio::test]
    async fn kinds_of_one_cms_take_one_foothold_between_them() {
        let (h, k) = ("http://127.0.0.1:1001", "http://127.0.0.1:1002");
        let c = calls_to(8, 32, &[("a", h), ("b", h), ("c", h), ("d", h), ("x", k)]);
        let _a = c.take(vec![Some("a".to_owned()); 224]).await;
        let _b = c.take(vec![Some("b".to_owned()); 24]).await;
        let mut t = c.tally();
        // Eight permits free: the CMS of a and b holds 248 calls, far above
        // its foothold; x's CMS holds none.
        assert_eq!((t.room("c"), t.room("d"), t.room("x")), (0, 0, 8));
        assert!(!t.admit("c"));
        for _ in 0..8 {
            assert!(t.admit("x"));
        }
        assert!(!t.admit("x"), "x's CMS is at its foothold");
        drop(t);
        // Each kind its own CMS (as before): c would take the foothold x
        // needs.
        let apart = calls(8, 32);
        let _a = apart.take(vec![Some("a".to_owned()); 224]).await;
        let _b = apart.take(vec![Some("b".to_owned()); 24]).await;
        assert_eq!(apart.tally().room("c"), 8);
    }

    #[tokio::test]
    async fn a_kind_at_its_share_is_turned_away_until_a_call_returns() {
        let c = calls(2, 4);
        let permits = c.take(vec![Some("slow".to_owned()); 4]).await;
        assert_eq!((permits.iter().flatten().count(), c.free()), (4, 4));
        let mut t = c.tally();
        assert!(!t.admit("slow"), "slow holds its share");
        // Kinds together may hold 7 of the 8, and any kind 1.
        assert_eq!((t.room("slow"), t.room("fast")), (0, 3));
        assert!(t.admit("fast"));
        assert_eq!(t.room("fast"), 2, "the read's own slot counts");
        drop(t);
        let mut permits = permits;
        permits.pop();
        assert_eq!(c.free(), 5);
        let mut t = c.tally();
        assert_eq!(t.room("slow"), 1);
        assert!(t.admit("slow"), "one of slow's calls returned");
        assert!(!t.admit("slow"), "the read's own slot counts");
        drop(permits);
        assert_eq!(c.free(), 8);
        // A group's permits sit beside its webhook slots; its record-only
        // slots take none.
        let mixed = c.take(vec![None, Some("a".to_owned()), None]).await;
        let shape: Vec<bool> = mixed.iter().map(Option::is_some).collect();
        assert_eq!((shape, c.free()), (vec![false, true, false], 7));
    }
}
