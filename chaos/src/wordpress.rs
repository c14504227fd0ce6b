//! The WordPress scenario (`chaos --cms wordpress`): the real planner and
//! workers publish to a real, throwaway WordPress (testkit's), under seeded
//! faults, and the run is judged by WordPress's own records — its posts
//! table and the status changes a must-use plugin logs as WordPress saves
//! them — not by anything slotgate says.
//!
//! Two kinds share the site:
//!
//! - `wp-article`: drafts live in WordPress (posts in `pending`); slotgate
//!   publishes the oldest ready one per slot by changing its status, at
//!   most `daily_cap` a day. A few plain `draft` posts are never ready.
//! - `wp-news`: drafts live in slotgate; each try stages the slot's post
//!   as an unpublished `draft` whose slug is the slot's marker, and the
//!   slot's one post (the lowest id with that slug) is published by a
//!   status change. Extra staged copies (a create that repeated) stay
//!   unpublished or go to the trash.
//!
//! Faults, each verified to have happened:
//!
//! - `wp-applied-lost`: the next REST write is held by WordPress after it
//!   saved it, past the worker's timeout (the answer is lost, the effect is
//!   not); the worker must find it before writing again;
//! - `wp-kill-mid-write`: the same, and then every worker is killed with
//!   SIGKILL and restarted (the call may have run; a takeover must read
//!   before writing);
//! - `wp-held-before-save`: the next REST creates (a `wp-news` post being
//!   staged; up to [`HELD_CREATES`] of them) wait in WordPress *before*
//!   they are saved, past the worker's timeout ("accepted, not yet saved":
//!   no read can see them), and are saved later all the same; the worker
//!   retries (a takeover may follow) while the first create is queued.
//!   Verified by WordPress's held count, and by the posts table: a copy of
//!   a `wp-news` draft saved at least the hold's length after the hold
//!   began, with another copy of the same draft saved in between;
//! - `editor-draft`, `editor-trash`, `editor-delete`: an editor pulls the
//!   oldest ready post back (to `draft`, to the trash, or deletes it) while
//!   slots run;
//! - duplicates from every caller: `planner trigger` and a `redis-cli`
//!   XADD of a finished slot, two XADDs of a due slot at once (`manual` and
//!   `planner`), and `planner backfill` while the workers are down after
//!   `wp-kill-mid-write` (it delivers a due slot the planner delivered
//!   too; the backfill restarts the workers).
//!
//! The judge's rules (a violation each):
//!
//! - `doubled`: a post saved as `publish` more than once;
//! - `created_twice`: two posts that went out (saved as `publish` at some
//!   point, whatever became of them later) for one slotgate draft (same
//!   title) or for one slot (its marker, or a `-N` form WordPress gave
//!   it). Staged copies that stayed `draft` or went to the trash without
//!   ever being published are what stage-then-publish leaves behind, seen
//!   by nobody: not a violation, counted in the report (`staged copies`);
//! - `withdrawn_published`: a post published after an editor pulled it
//!   back, unless the pull-back landed between slotgate's read of the post
//!   and its write (WordPress has no conditional update, so that window of
//!   one round trip is the documented limit of read-before-write; such a
//!   case is counted as `raced`, not hidden);
//! - `not_ready_published`: a post that was never ready got published;
//! - `lost`: fewer posts published than the cap and the ready drafts allow;
//! - `phantom`: a slot recorded `published` whose link WordPress does not
//!   show as a published post, or a published post no slot accounts for;
//! - `failed`, `unsettled`, `worker_exit`: a slot failed, the run did not
//!   settle, a worker did not exit cleanly on SIGTERM.

use crate::model::{Class, Fault, FaultRecord, Outcome, PlanSlot, Violation};
use crate::stack::{Stack, StackOptions};
use anyhow::{bail, Context, Result};
use chrono::{Duration as CDuration, Utc};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::process::Proc;
use testkit::server::{OwnedWordPress, WpOp, WpPost, WpTransition};

/// The in-place kind (drafts are WordPress posts in `pending`).
const ARTICLE: &str = "wp-article";
/// The creating kind (drafts in slotgate, each publish creates a post).
const NEWS: &str = "wp-news";
/// Ready posts of [`ARTICLE`] at the start.
const READY: usize = 10;
/// Plain `draft` posts of [`ARTICLE`]: never ready, never published.
const NOT_READY: usize = 2;
/// Pull-backs by the editor (one of each kind).
const WITHDRAWALS: usize = 3;
/// [`ARTICLE`]'s slots and cap: enough slots that every ready post that is
/// not pulled back is published, even if each pull-back costs a slot.
const ARTICLE_SLOTS: usize = 13;
const ARTICLE_CAP: usize = READY - WITHDRAWALS;
/// [`NEWS`]'s drafts, slots and cap.
const NEWS_DRAFTS: usize = 6;
const NEWS_SLOTS: usize = 8;
const NEWS_CAP: usize = 6;
/// The kinds' `http_timeout`, and how long a held write waits before
/// WordPress answers (well past the timeout: the answer is lost).
const HTTP_TIMEOUT: &str = "2s";
const HOLD_SECONDS: u64 = 5;
/// How many REST creates one `wp-held-before-save` holds before their save
/// at most (the first try's and, usually, its retry's).
const HELD_CREATES: u32 = 2;
/// The environment variable that carries the application password.
const PASSWORD_ENV: &str = "CHAOS_WP_PASSWORD";

/// The command line's part this scenario uses.
pub struct Options {
    pub seed: u64,
    pub duration: Duration,
    pub workers: u32,
    pub settle: Duration,
    pub stack: StackOptions,
    pub keep: bool,
    pub json: bool,
}

/// The schedule of one run: how many of each fault. Its order is the
/// order the times are drawn in: a new fault goes last, so a recorded seed
/// keeps the times of the faults it had.
const SCHEDULE: [(Fault, usize); 10] = [
    (Fault::WpAppliedLost, 3),
    (Fault::WpKillMidWrite, 1),
    (Fault::EditorDraft, 1),
    (Fault::EditorTrash, 1),
    (Fault::EditorDelete, 1),
    (Fault::TriggerDup, 1),
    (Fault::BackfillDup, 1),
    (Fault::XaddDup, 1),
    (Fault::ConcurrentDup, 1),
    (Fault::WpHeldBeforeSave, 1),
];

/// One slot's final row, with the link slotgate recorded for it.
#[derive(Debug, Clone)]
pub struct SlotRow {
    pub kind: String,
    pub slot: String,
    pub state: String,
    pub reason: Option<String>,
    pub url: Option<String>,
    /// The WordPress post id of a draft that lives in WordPress.
    pub cms_id: Option<i64>,
}

/// Everything the judge reads. WordPress's records are the evidence;
/// slotgate's rows are what is checked against them.
pub struct Evidence<'a> {
    /// Posts of the in-place kind that were ready at the start.
    pub ready: &'a [i64],
    /// Posts that were never ready.
    pub not_ready: &'a [i64],
    /// Posts the editor pulled back (by id) while they were ready.
    pub withdrawn: &'a [i64],
    /// Posts the editor meant to pull back that slotgate had published by
    /// then (the editor's change came second).
    pub unpublished: &'a [i64],
    /// Titles of the creating kind's drafts.
    pub news_titles: &'a [String],
    /// The creating kind's slots and their markers: (slot key, marker).
    pub news_markers: &'a [(String, String)],
    pub transitions: &'a [WpTransition],
    /// The posts table after the run.
    pub posts: &'a [WpPost],
    pub rows: &'a [SlotRow],
    pub settled: bool,
    pub unclean_exits: &'a [String],
}

/// The judge's findings.
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    /// Pull-backs that landed between slotgate's read and its write.
    pub raced: Vec<i64>,
    pub published_in_place: usize,
    /// Slotgate drafts that went out as a post.
    pub created: usize,
    /// Posts of the creating kind that never went out: staged copies left
    /// behind (as drafts, or in the trash).
    pub staged_copies: usize,
    /// Of those, the ones in the trash.
    pub staged_trashed: usize,
    /// Posts of the creating kind whose slug is no slot's marker (the
    /// per-slot rule cannot place them; there should be none).
    pub unmarked: Vec<i64>,
}

impl Verdict {
    pub fn count(&self, c: Class) -> usize {
        self.violations.iter().filter(|v| v.class == c).count()
    }
}

/// A save that left the post published (a creation as `publish`, a
/// status change to it, or a second write of it).
fn saved_publish(t: &WpTransition) -> bool {
    t.op == WpOp::Save && t.to == "publish"
}

/// The slot whose post this slug is: the slot's marker, a `-N` form
/// WordPress gave it (a publish while another post held the marker), or
/// either one's trashed form (`…__trashed`).
fn slot_of_slug<'m>(slug: &str, markers: &'m [(String, String)]) -> Option<&'m str> {
    let base = slug.find("__trashed").map_or(slug, |i| &slug[..i]);
    markers.iter().find_map(|(slot, m)| {
        let rest = base.strip_prefix(m.as_str())?;
        let numbered = rest
            .strip_prefix('-')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        (rest.is_empty() || numbered).then_some(slot.as_str())
    })
}

/// Judges a run by WordPress's own records. Pure, so that its rules are
/// tested against histories that break them.
pub fn judge(ev: &Evidence<'_>) -> Verdict {
    let mut violations = Vec::new();
    let mut bad = |c: Class, m: String| violations.push(Violation::new(c, None, m));
    // Each post's history, in WordPress's order.
    let mut history: BTreeMap<i64, Vec<&WpTransition>> = BTreeMap::new();
    for t in ev.transitions {
        history.entry(t.id).or_default().push(t);
    }
    for (id, h) in &history {
        let n = h.iter().filter(|t| saved_publish(t)).count();
        if n > 1 {
            bad(
                Class::Doubled,
                format!("post {id} was saved as publish {n} times"),
            );
        }
    }
    let published_ever = |id: i64| {
        history
            .get(&id)
            .is_some_and(|h| h.iter().any(|t| saved_publish(t)))
    };
    for id in ev.not_ready {
        if published_ever(*id) {
            bad(
                Class::NotReadyPublished,
                format!("post {id} was never ready and was published"),
            );
        }
    }
    let mut withdrawn_effective = 0;
    let mut raced = Vec::new();
    for id in ev.withdrawn {
        let h = history.get(id).map(Vec::as_slice).unwrap_or_default();
        // The editor's pull-back: a change away from the ready status.
        let Some(w) = h.iter().position(|t| {
            t.op != WpOp::Read && t.from == "pending" && t.to != "pending" && t.to != "publish"
        }) else {
            continue;
        };
        withdrawn_effective += 1;
        let Some(p) = h[w..].iter().position(|t| saved_publish(t)).map(|i| w + i) else {
            continue;
        };
        // Published after the pull-back: tolerated only when the last read
        // before that write came before the pull-back (the write was
        // decided on a status that was still ready).
        let last_read = h[..p].iter().rposition(|t| t.op == WpOp::Read);
        if last_read.is_some_and(|r| r < w) {
            raced.push(*id);
        } else {
            bad(
                Class::WithdrawnPublished,
                format!("post {id} was published after the editor pulled it back"),
            );
        }
    }
    let ready_published = ev.ready.iter().filter(|id| published_ever(**id)).count();
    let expected = ARTICLE_CAP.min(ev.ready.len() - withdrawn_effective + raced.len());
    if ev.settled && ready_published < expected {
        bad(
            Class::Lost,
            format!("{ready_published} ready posts published, the cap and the ready posts allow {expected}"),
        );
    }
    // The creating kind's posts, by draft (each draft's title is its own)
    // and by slot (the marker slug). Only copies that went out count: a
    // staged copy that stayed a draft, or went to the trash unpublished,
    // was never seen by a reader.
    let is_news = |p: &WpPost| {
        ev.news_titles.iter().any(|t| t == &p.title)
            || slot_of_slug(&p.slug, ev.news_markers).is_some()
    };
    let went_out = |p: &WpPost| p.status == "publish" || published_ever(p.id);
    let mut by_title: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut by_slot: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let (mut staged_copies, mut staged_trashed) = (0, 0);
    let mut unmarked = Vec::new();
    for p in ev.posts.iter().filter(|p| is_news(p)) {
        if slot_of_slug(&p.slug, ev.news_markers).is_none() {
            unmarked.push(p.id);
        }
        if !went_out(p) {
            staged_copies += 1;
            staged_trashed += usize::from(p.status == "trash");
            continue;
        }
        by_title.entry(p.title.as_str()).or_default().push(p.id);
        if let Some(slot) = slot_of_slug(&p.slug, ev.news_markers) {
            by_slot.entry(slot).or_default().push(p.id);
        }
    }
    let mut reported: HashSet<Vec<i64>> = HashSet::new();
    for (title, ids) in &by_title {
        if ids.len() > 1 && reported.insert(ids.clone()) {
            bad(
                Class::CreatedTwice,
                format!(
                    "{} posts went out for the draft {title:?}: {ids:?}",
                    ids.len()
                ),
            );
        }
    }
    for (slot, ids) in &by_slot {
        if ids.len() > 1 && reported.insert(ids.clone()) {
            bad(
                Class::CreatedTwice,
                format!("{} posts went out for the slot {slot}: {ids:?}", ids.len()),
            );
        }
    }
    let created = by_title.len();
    let news_expected = NEWS_CAP.min(ev.news_titles.len());
    if ev.settled && created < news_expected {
        bad(
            Class::Lost,
            format!("{created} posts created, the cap and the drafts allow {news_expected}"),
        );
    }
    // slotgate's records against WordPress's.
    let live: HashMap<&str, &WpPost> = ev
        .posts
        .iter()
        .filter(|p| p.status == "publish")
        .map(|p| (p.link.as_str(), p))
        .collect();
    let mut accounted = HashSet::new();
    for r in ev.rows {
        match r.state.as_str() {
            // A post the editor moved after slotgate published it (its
            // pull-back came too late) is the editor's doing.
            "published" if r.cms_id.is_some_and(|id| ev.unpublished.contains(&id)) => {}
            "published" => match r.url.as_deref().and_then(|u| live.get(u)) {
                Some(p) => {
                    if !accounted.insert(p.id) {
                        bad(
                            Class::Phantom,
                            format!("{} records post {} that another slot records too", r.slot, p.id),
                        );
                    }
                }
                None => bad(
                    Class::Phantom,
                    format!(
                        "{} is recorded published at {:?}, which WordPress does not show as a published post",
                        r.slot, r.url
                    ),
                ),
            },
            "failed" => bad(
                Class::Failed,
                format!("{} failed ({})", r.slot, r.reason.as_deref().unwrap_or("?")),
            ),
            "skipped" => {}
            other => bad(
                Class::Unsettled,
                format!("{} is still {other}", r.slot),
            ),
        }
    }
    for p in live.values() {
        // A post the editor pulled back that raced a write is published,
        // and so is one the editor may have left published: only posts of
        // slotgate's kinds count.
        let ours = ev.ready.contains(&p.id) || is_news(p);
        if ours && !accounted.contains(&p.id) {
            bad(
                Class::Phantom,
                format!(
                    "post {} ({:?}) is published and no slot records it",
                    p.id, p.title
                ),
            );
        }
    }
    if !ev.settled {
        bad(Class::Unsettled, "the run did not settle in time".into());
    }
    for w in ev.unclean_exits {
        bad(Class::WorkerExit, w.clone());
    }
    Verdict {
        violations,
        raced,
        published_in_place: ready_published,
        created,
        staged_copies,
        staged_trashed,
        unmarked,
    }
}

/// A scheduled fault: when (ms after the window opens) and what.
#[derive(Debug, Clone, Copy)]
struct Event {
    at_ms: u64,
    fault: Fault,
}

/// What became of one scheduled fault.
#[derive(Debug, Clone)]
struct Record {
    fault: Fault,
    injected: bool,
    verified: bool,
    detail: String,
}

/// The run's moving parts.
struct Run {
    stack: Stack,
    wp: Arc<OwnedWordPress>,
    plan: Vec<PlanSlot>,
    t0: Instant,
    workers: std::sync::Mutex<Vec<Proc>>,
    generation: std::sync::atomic::AtomicU32,
    rng: std::sync::Mutex<StdRng>,
    /// Duplicate entries added: (fault, entry id).
    entries: std::sync::Mutex<Vec<(Fault, String)>>,
    withdrawn: std::sync::Mutex<Vec<i64>>,
    /// Posts the editor's pull-back reached only after slotgate had
    /// published them.
    unpublished: std::sync::Mutex<Vec<i64>>,
    /// Workers killed by `wp-kill-mid-write`, to be restarted.
    down: std::sync::Mutex<u32>,
    /// Each `wp-held-before-save`, in order: when the harness saw the
    /// first create held (µs since the epoch, the clock WordPress's log
    /// uses) and how many creates it held.
    held_before_save: std::sync::Mutex<Vec<(i64, u32)>>,
}

/// Now, in microseconds since the Unix epoch (as WordPress's log).
fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The trace a create held before its save (seen held at `held_at`, µs)
/// leaves in WordPress's records: a copy of a creating-kind draft whose
/// creation was saved at least the hold's length later (PHP saved it after
/// its client had given up), with another copy of the same draft saved in
/// between (the worker tried again while the first create was queued).
/// The two posts' ids, late copy first.
fn held_create_trace(
    held_at: i64,
    transitions: &[WpTransition],
    posts: &[WpPost],
    news_titles: &[String],
) -> Option<(i64, i64)> {
    let hold_us = HOLD_SECONDS as i64 * 1_000_000;
    let created: HashMap<i64, i64> = transitions
        .iter()
        .filter(|t| t.op == WpOp::Save && t.from == "new")
        .map(|t| (t.id, t.at))
        .collect();
    let news: Vec<(&WpPost, i64)> = posts
        .iter()
        .filter(|p| news_titles.iter().any(|t| t == &p.title))
        .filter_map(|p| Some((p, *created.get(&p.id)?)))
        .collect();
    news.iter().find_map(|(late, at)| {
        let window = held_at + hold_us - 500_000..held_at + hold_us + 10_000_000;
        if !window.contains(at) {
            return None;
        }
        news.iter()
            .find(|(p, a)| {
                p.id != late.id && p.title == late.title && (held_at - 200_000..*at).contains(a)
            })
            .map(|(p, _)| (late.id, p.id))
    })
}

impl Run {
    fn spawn_workers(&self, n: u32) {
        let g = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut w = self.workers.lock().unwrap();
        for i in 1..=n {
            let id = format!("w{i}-g{g}");
            w.push(self.stack.spawn_worker(&id, &id, false));
        }
    }

    /// Injects each scheduled fault at its time, in order; what became of
    /// each (verified later, by [`Run::verify`]).
    async fn inject_all(&self, events: &[Event], window_end: Instant) -> Vec<Record> {
        let mut records = Vec::new();
        for ev in events {
            tokio::time::sleep_until((self.t0 + Duration::from_millis(ev.at_ms)).into()).await;
            let (injected, detail) = match self.inject(*ev, window_end).await {
                Ok(detail) => (true, detail),
                Err(e) => (false, format!("{e:#}")),
            };
            let rec = Record {
                fault: ev.fault,
                injected,
                verified: false,
                detail,
            };
            println!(
                "  [{:>6} ms] {}: {}",
                self.t0.elapsed().as_millis(),
                ev.fault.name(),
                rec.detail
            );
            records.push(rec);
        }
        records
    }

    /// Waits until every slot has an outcome and nothing is queued, three
    /// polls in a row, after the window; false when `settle` after the
    /// window passed first.
    async fn settle(&self, window_end: Instant, settle: Duration) -> Result<bool> {
        let deadline = window_end.max(Instant::now()) + settle;
        let total = self.plan.len();
        let mut stable = 0;
        loop {
            let done = self.stack.outcomes(&[ARTICLE, NEWS]).await?.len();
            let (len, pending, delayed) = self.stack.residue().await.unwrap_or((1, 1, 1));
            let quiet =
                Instant::now() >= window_end && done >= total && len + pending + delayed == 0;
            stable = if quiet { stable + 1 } else { 0 };
            if stable >= 3 {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                println!("chaos: not settled: {done}/{total} slots with an outcome, stream {len} ({pending} pending), delayed {delayed}");
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Stops the workers with SIGTERM (15 s grace); one line per worker
    /// that did not exit cleanly.
    async fn stop_workers(&self) -> Vec<String> {
        let procs = std::mem::take(&mut *self.workers.lock().unwrap());
        crate::run::stop(procs).await
    }

    /// Marks each injected fault verified when its trace is where it must
    /// be: WordPress's held-write count, the transition of the post it
    /// withdrew (`withdrawn`, in order), the duplicate entry's execution row,
    /// the late save of a create held before it ([`held_create_trace`]).
    async fn verify(
        &self,
        records: &mut [Record],
        transitions: &[WpTransition],
        posts: &[WpPost],
        news_titles: &[String],
        withdrawn: &[i64],
        held: u32,
    ) -> Result<()> {
        let entries = self.entries.lock().unwrap().clone();
        let before_save = self.held_before_save.lock().unwrap().clone();
        let holds = records
            .iter()
            .filter(|x| {
                x.injected && matches!(x.fault, Fault::WpAppliedLost | Fault::WpKillMidWrite)
            })
            .count() as u32
            + before_save.iter().map(|(_, n)| n).sum::<u32>();
        let mut wi = withdrawn.iter();
        let mut hb = before_save.iter();
        for rec in records.iter_mut().filter(|x| x.injected) {
            rec.verified = match rec.fault {
                // Each hold waited for the held count to rise; the count is
                // WordPress's plugin's own.
                Fault::WpAppliedLost | Fault::WpKillMidWrite => held >= holds,
                Fault::EditorDraft | Fault::EditorTrash | Fault::EditorDelete => {
                    let id = *wi.next().unwrap_or(&-1);
                    let to = match rec.fault {
                        Fault::EditorDraft => "draft",
                        Fault::EditorTrash => "trash",
                        _ => "deleted",
                    };
                    transitions.iter().any(|t| {
                        t.id == id && t.op != WpOp::Read && t.from == "pending" && t.to == to
                    })
                }
                Fault::TriggerDup | Fault::XaddDup | Fault::ConcurrentDup => {
                    let mine: Vec<&String> = entries
                        .iter()
                        .filter(|(f, _)| *f == rec.fault)
                        .map(|(_, e)| e)
                        .collect();
                    let mut all = !mine.is_empty();
                    for e in mine {
                        let n: i64 = sqlx::query_scalar(
                            "SELECT count(*) FROM execution WHERE entry_id = $1",
                        )
                        .bind(e)
                        .fetch_one(&self.stack.kit.pool)
                        .await?;
                        all &= n > 0;
                    }
                    all
                }
                // `delivered` named the slots it put on the stream.
                Fault::BackfillDup => true,
                Fault::WpHeldBeforeSave => match hb.next() {
                    None => false,
                    Some(&(at, n)) => {
                        let trace = held_create_trace(at, transitions, posts, news_titles);
                        match trace {
                        Some((late, other)) => println!(
                            "  wp-held-before-save: {n} create(s) held; post {late} saved {HOLD_SECONDS} s later, after post {other} of the same draft"
                        ),
                        None => println!(
                            "  wp-held-before-save: {n} create(s) held, but no copy of a {NEWS} draft was saved {HOLD_SECONDS} s later after another copy"
                        ),
                    }
                        held >= holds && trace.is_some()
                    }
                },
                // Not a fault of this scenario's [`SCHEDULE`].
                _ => false,
            };
        }
        Ok(())
    }

    /// Arms a hold of the next REST write (held after WordPress saved
    /// it) or, with `creates`, of the next [`HELD_CREATES`] creates (held
    /// before their save), and waits (up to `within`) until the first took
    /// it, then up to the hold's length for the rest (a retry's create
    /// comes after the timeout); the hold is then withdrawn, so no later
    /// fault finds it armed (writes held already sleep on). When the first
    /// was seen held (µs since the epoch) and how many were.
    async fn hold_next(&self, creates: bool, within: Duration) -> Result<(i64, u32)> {
        let before = self.wp.held_writes();
        let count = if creates {
            self.wp.hold_creates_before_save(HOLD_SECONDS, HELD_CREATES);
            HELD_CREATES
        } else {
            self.wp.hold_writes(HOLD_SECONDS, 1);
            1
        };
        let deadline = Instant::now() + within;
        let first = loop {
            if self.wp.held_writes() > before {
                break now_us();
            }
            if Instant::now() >= deadline {
                self.wp.release_holds();
                bail!("no REST write came within {within:?} to hold");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let more = Instant::now() + Duration::from_secs(HOLD_SECONDS);
        while self.wp.held_writes() < before + count && Instant::now() < more {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.wp.release_holds();
        Ok((first, self.wp.held_writes() - before))
    }

    /// A slot due by now (waiting for the first one if none is), chosen
    /// by the run's RNG.
    async fn due_slot(&self) -> String {
        loop {
            let now = Utc::now();
            let due: Vec<&PlanSlot> = self.plan.iter().filter(|p| p.due_at <= now).collect();
            if !due.is_empty() {
                let i = self.rng.lock().unwrap().gen_range(0..due.len());
                return due[i].slot.clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A slot that has an outcome, waiting up to `within` for one.
    async fn finished_slot(&self, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            let done: Vec<String> = sqlx::query_scalar(
                "SELECT kind || ':' || day::text || ':' || slot FROM publish_slot \
                 WHERE state IN ('published', 'skipped') AND kind = ANY($1) ORDER BY kind, slot",
            )
            .bind([ARTICLE, NEWS])
            .fetch_all(&self.stack.kit.pool)
            .await?;
            if !done.is_empty() {
                let i = self.rng.lock().unwrap().gen_range(0..done.len());
                return Ok(done[i].clone());
            }
            if Instant::now() >= deadline {
                bail!("no slot finished within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn xadd(&self, slot: &str, caller: &str) -> Result<String> {
        let fields = [("slot", slot.as_bytes()), ("caller", caller.as_bytes())];
        self.stack.xadd("*", &fields).await
    }

    /// The editor pulls back a ready post, as `fault` says; the post's
    /// id. The post is the third oldest ready one that slotgate has not
    /// bound to a slot (the oldest are the next to be published, and
    /// WordPress has no conditional update, so a pull-back of a post being
    /// published races the write). Should slotgate publish it between the
    /// choice and the change all the same (WordPress's record says the
    /// change came from `publish`), that post is set aside as the editor's
    /// unpublishing and another is pulled back.
    async fn withdraw(&self, fault: Fault) -> Result<i64> {
        for _ in 0..5 {
            let bound: HashSet<i64> = sqlx::query_scalar(
                "SELECT cms_id FROM draft WHERE kind = $1 AND cms_id IS NOT NULL AND status <> 'ready'",
            )
            .bind(ARTICLE)
            .fetch_all(&self.stack.kit.pool)
            .await?
            .into_iter()
            .collect();
            let touched = self.unpublished.lock().unwrap().clone();
            let mut ready: Vec<WpPost> = self
                .wp
                .posts()
                .await
                .into_iter()
                .filter(|p| {
                    p.status == "pending" && !bound.contains(&p.id) && !touched.contains(&p.id)
                })
                .collect();
            ready.sort_by(|a, b| a.date_gmt.cmp(&b.date_gmt).then(a.id.cmp(&b.id)));
            let Some(p) = ready.get(2).or(ready.last()) else {
                bail!("no ready post left to pull back");
            };
            match fault {
                Fault::EditorDraft => self.wp.set_status(p.id, "draft").await,
                Fault::EditorTrash => self.wp.trash(p.id).await,
                _ => self.wp.delete(p.id).await,
            }
            let came_from = self
                .wp
                .transitions()
                .into_iter()
                .rfind(|t| t.id == p.id && t.op != WpOp::Read)
                .map(|t| t.from);
            if came_from.as_deref() == Some("pending") {
                self.withdrawn.lock().unwrap().push(p.id);
                return Ok(p.id);
            }
            self.unpublished.lock().unwrap().push(p.id);
        }
        bail!("every pull-back came after slotgate had published the post")
    }

    async fn inject(&self, ev: Event, window_end: Instant) -> Result<String> {
        let within =
            (window_end + Duration::from_secs(10)).saturating_duration_since(Instant::now());
        match ev.fault {
            Fault::WpAppliedLost => {
                self.hold_next(false, within.max(Duration::from_secs(5)))
                    .await?;
                Ok(format!(
                    "a write held {HOLD_SECONDS} s after WordPress saved it"
                ))
            }
            Fault::WpKillMidWrite => {
                self.hold_next(false, within.max(Duration::from_secs(5)))
                    .await?;
                let mut procs: Vec<Proc> = std::mem::take(&mut *self.workers.lock().unwrap());
                let n = procs.len();
                for p in &mut procs {
                    if p.kill_9().is_err() {
                        bail!("worker {} had already exited", p.name);
                    }
                }
                // Restarted by the backfill that follows (while the fleet
                // is down, a due slot has no outcome yet: the backfill has
                // something to deliver twice).
                *self.down.lock().unwrap() = n as u32;
                Ok(format!(
                    "a write held, then all {n} workers killed with SIGKILL"
                ))
            }
            Fault::WpHeldBeforeSave => {
                let (at, n) = self
                    .hold_next(true, within.max(Duration::from_secs(5)))
                    .await?;
                self.held_before_save.lock().unwrap().push((at, n));
                Ok(format!(
                    "{n} REST create(s) held {HOLD_SECONDS} s before WordPress saved them"
                ))
            }
            Fault::EditorDraft | Fault::EditorTrash | Fault::EditorDelete => {
                let id = self.withdraw(ev.fault).await?;
                Ok(format!("post {id}"))
            }
            Fault::TriggerDup => {
                let slot = self.finished_slot(within).await?;
                let entry = self.stack.trigger(&slot).await?;
                self.entries.lock().unwrap().push((ev.fault, entry));
                Ok(format!("planner trigger {slot}"))
            }
            Fault::XaddDup => {
                let slot = self.finished_slot(within).await?;
                let entry = self.xadd(&slot, "redis-cli").await?;
                self.entries.lock().unwrap().push((ev.fault, entry));
                Ok(format!("XADD {slot} caller redis-cli"))
            }
            Fault::ConcurrentDup => {
                let slot = self.due_slot().await;
                let (a, b) = tokio::join!(self.xadd(&slot, "manual"), self.xadd(&slot, "planner"));
                for e in [a?, b?] {
                    self.entries.lock().unwrap().push((ev.fault, e));
                }
                Ok(format!("two XADDs of {slot} at once"))
            }
            Fault::BackfillDup => {
                let res = self.backfill(within).await;
                let down = std::mem::take(&mut *self.down.lock().unwrap());
                if down > 0 {
                    self.spawn_workers(down);
                }
                let b = res?;
                Ok(if down > 0 {
                    format!("while the workers were down, {b}; {down} workers restarted")
                } else {
                    b
                })
            }
            f => bail!("{} is not a fault of the WordPress scenario", f.name()),
        }
    }

    /// `planner backfill` of the day, once a slot is due without an
    /// outcome (so that it delivers something the planner delivered too).
    async fn backfill(&self, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            let kind = if self.rng.lock().unwrap().gen_bool(0.5) {
                ARTICLE
            } else {
                NEWS
            };
            let delivered = self.stack.backfill(kind).await?;
            if !delivered.is_empty() {
                return Ok(format!(
                    "planner backfill {kind} delivered {}",
                    delivered.join(" ")
                ));
            }
            if Instant::now() >= deadline {
                bail!("planner backfill found no open slot to deliver");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `n` distinct whole-second offsets in `[lo, hi)`, sorted.
fn offsets(rng: &mut StdRng, n: usize, lo: u64, hi: u64) -> Vec<u64> {
    let mut all: Vec<u64> = (lo..hi).collect();
    all.shuffle(rng);
    let mut v: Vec<u64> = all.into_iter().take(n).collect();
    v.sort_unstable();
    v
}

fn kind_toml(
    out: &mut String,
    name: &str,
    zone: &str,
    slots: &[String],
    cap: usize,
    wp: &OwnedWordPress,
    drafts: Option<&str>,
) {
    let _ = writeln!(out, "\n[[kinds]]\nname = \"{name}\"\ntimezone = \"{zone}\"");
    let _ = writeln!(out, "slots = [{}]", slots.join(", "));
    let _ = writeln!(
        out,
        "jitter = \"1s\"\ndaily_cap = {cap}\nstarting_deadline = \"1h\""
    );
    let _ = writeln!(out, "http_timeout = \"{HTTP_TIMEOUT}\"\nhttp_attempts = 6\nretry_base = \"50ms\"\nretry_cap = \"1s\"");
    let _ = writeln!(
        out,
        "[kinds.wordpress]\nurl = \"{}\"\nuser = \"{}\"",
        wp.url(),
        wp.admin().0
    );
    let _ = writeln!(
        out,
        "app_password_env = \"{PASSWORD_ENV}\"\nrefresh_every = \"0s\""
    );
    if let Some(d) = drafts {
        let _ = writeln!(out, "drafts = \"{d}\"");
    }
}

fn render_posts(posts: &[WpPost]) -> String {
    let mut s = String::new();
    for p in posts {
        let _ = writeln!(
            s,
            "  {:>4}  {:<8} {:<28} {:<19} {}",
            p.id, p.status, p.title, p.date_gmt, p.slug
        );
    }
    s
}

/// Runs the scenario; see the module's overview. The steps, in order:
/// the editors' posts, the config and drafts, the fault schedule, the
/// workers, each fault at its time, the settle, the stop, the faults'
/// verification, the judge, the report.
pub async fn run(o: Options) -> Result<Outcome> {
    let mut rng = StdRng::seed_from_u64(o.seed ^ 0x77_70_63_68_61_6f_73);
    println!(
        "chaos: WordPress scenario, seed {} (replay: chaos --cms wordpress --seed {} --duration {} --workers {})",
        o.seed,
        o.seed,
        humantime::format_duration(o.duration),
        o.workers
    );
    let wp = tokio::task::spawn_blocking(OwnedWordPress::launch)
        .await?
        .context(
            "starting the test WordPress (Debian's wordpress, mariadb-server, php-cli, php-mysql)",
        )?;
    let wp = Arc::new(wp);
    let mut stack = Stack::create(o.stack.clone(), o.seed, &[(PASSWORD_ENV, wp.admin().1)]).await?;
    let (ready, not_ready) = editors_posts(&wp, &mut rng).await;
    println!(
        "WordPress posts before:\n{}",
        render_posts(&wp.posts().await)
    );
    let news_titles = configure(&mut stack, &wp, &mut rng, &o).await?;
    // No `planner drafts sync`: the workers must see WordPress's drafts on
    // their own.
    let planned = stack.plan_day(ARTICLE_SLOTS + NEWS_SLOTS).await?;
    let news_markers = markers(&planned, o.seed)?;
    let events = schedule(&mut rng, o.duration.as_secs());
    println!(
        "chaos: day {} (zone {}); {ARTICLE}: {ARTICLE_SLOTS} slots, cap {ARTICLE_CAP}, {READY} ready posts + {NOT_READY} plain drafts in WordPress; {NEWS}: {NEWS_SLOTS} slots, cap {NEWS_CAP}, {NEWS_DRAFTS} drafts in slotgate; {} workers",
        stack.day, stack.zone, o.workers
    );
    println!("schedule (ms after the window opens; run in order, each verified before the next):");
    for e in &events {
        println!("  {:>6}  {}", e.at_ms, e.fault.name());
    }
    let base_in = (stack.base - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    let r = Arc::new(Run {
        stack,
        wp: wp.clone(),
        plan: planned,
        t0: Instant::now() + base_in,
        workers: std::sync::Mutex::new(Vec::new()),
        generation: std::sync::atomic::AtomicU32::new(1),
        rng: std::sync::Mutex::new(StdRng::seed_from_u64(o.seed ^ 0x5eed)),
        entries: std::sync::Mutex::new(Vec::new()),
        withdrawn: std::sync::Mutex::new(Vec::new()),
        unpublished: std::sync::Mutex::new(Vec::new()),
        down: std::sync::Mutex::new(0),
        held_before_save: std::sync::Mutex::new(Vec::new()),
    });
    r.spawn_workers(o.workers);
    let window_end = r.t0 + o.duration;
    let mut records = r.inject_all(&events, window_end).await;
    let settled = r.settle(window_end, o.settle).await?;
    let unclean = r.stop_workers().await;
    // Verification: the faults' traces in WordPress's and slotgate's
    // records.
    let transitions = wp.transitions();
    let held = wp.held_writes();
    let withdrawn = r.withdrawn.lock().unwrap().clone();
    let after = wp.posts().await;
    r.verify(
        &mut records,
        &transitions,
        &after,
        &news_titles,
        &withdrawn,
        held,
    )
    .await?;
    let rows = slot_rows(&r.stack.kit.pool).await?;
    let unpublished = r.unpublished.lock().unwrap().clone();
    let verdict = judge(&Evidence {
        ready: &ready,
        not_ready: &not_ready,
        withdrawn: &withdrawn,
        unpublished: &unpublished,
        news_titles: &news_titles,
        news_markers: &news_markers,
        transitions: &transitions,
        posts: &after,
        rows: &rows,
        settled,
        unclean_exits: &unclean,
    });
    println!("\nWordPress posts after:\n{}", render_posts(&after));
    let outcome = report(&o, &verdict, &records, &rows, &transitions, held);
    let replay = format!("--cms wordpress --seed {}", o.seed);
    r.stack
        .finish(matches!(outcome, Outcome::Pass), o.keep, &replay);
    Ok(outcome)
}

/// The editors' posts: ready ones with shuffled dates (so WordPress's
/// "oldest first" differs from id order), and plain drafts. Their ids,
/// (ready, not ready).
async fn editors_posts(wp: &OwnedWordPress, rng: &mut StdRng) -> (Vec<i64>, Vec<i64>) {
    let mut days: Vec<u32> = (1..=READY as u32).collect();
    days.shuffle(rng);
    let mut ready = Vec::new();
    for (i, d) in days.iter().enumerate() {
        let date = format!("2026-01-{d:02}T09:00:00");
        ready.push(
            wp.create_post(&format!("Ready article {i}"), "pending", Some(&date))
                .await,
        );
    }
    let mut not_ready = Vec::new();
    for i in 0..NOT_READY {
        not_ready.push(
            wp.create_post(&format!("Unfinished draft {i}"), "draft", None)
                .await,
        );
    }
    (ready, not_ready)
}

/// The window (every slot in one local day around noon, from 5 s from
/// now), the config of both kinds, and slotgate's own news drafts,
/// imported through the real planner after `migrate` and `check`. Returns
/// the news drafts' titles.
async fn configure(
    stack: &mut Stack,
    wp: &OwnedWordPress,
    rng: &mut StdRng,
    o: &Options,
) -> Result<Vec<String>> {
    let secs = o.duration.as_secs();
    let zone = stack.open_window(Duration::from_secs(4), o.duration)?;
    let base = stack.base;
    let at = |s: u64| format!("\"{}\"", zone.hms(base + CDuration::seconds(s as i64)));
    let article: Vec<String> = offsets(
        rng,
        ARTICLE_SLOTS,
        2,
        secs.max(ARTICLE_SLOTS as u64 + 4) - 2,
    )
    .into_iter()
    .map(at)
    .collect();
    let news: Vec<String> = offsets(rng, NEWS_SLOTS, 2, secs.max(NEWS_SLOTS as u64 + 4) - 2)
        .into_iter()
        .map(at)
        .collect();
    let mut toml = format!("jitter_seed = \"chaos-wp-{}\"\n", o.seed);
    kind_toml(
        &mut toml,
        ARTICLE,
        &stack.zone,
        &article,
        ARTICLE_CAP,
        wp,
        Some("pending"),
    );
    kind_toml(&mut toml, NEWS, &stack.zone, &news, NEWS_CAP, wp, None);
    std::fs::write(&stack.kit.config, toml).context("writing the config")?;
    let news_titles: Vec<String> = (0..NEWS_DRAFTS).map(|i| format!("News item {i}")).collect();
    stack.planner_ok(&["migrate"]).await?;
    stack.planner_ok(&["check"]).await?;
    let drafts = news_titles
        .iter()
        .map(|t| serde_json::json!({"kind": NEWS, "title": t, "body": format!("<p>{t}</p>")}));
    stack.import_drafts(drafts).await?;
    Ok(news_titles)
}

/// The creating kind's slots and their markers, as the workers make them
/// (the default slug template, `jitter_seed = "chaos-wp-<seed>"`): how the
/// judge tells which slot a post is, whatever its title.
fn markers(plan: &[PlanSlot], seed: u64) -> Result<Vec<(String, String)>> {
    let template = slotgate::config::SlugTemplate::parse(slotgate::config::DEFAULT_SLUG)
        .map_err(|e| anyhow::anyhow!("the default slug template: {e}"))?;
    let tag = slotgate::receiver::wordpress::marker_tag(&format!("chaos-wp-{seed}"), NEWS);
    let mut out = Vec::new();
    for p in plan.iter().filter(|p| p.kind == NEWS) {
        let k: slotgate::slot::SlotKey = p.slot.parse().context("a planned slot's key")?;
        out.push((
            p.slot.clone(),
            format!("{}-{tag}", template.fill(&k.kind, k.day, k.slot_no, 0)),
        ));
    }
    Ok(out)
}

/// The faults' schedule ([`SCHEDULE`]), in the order they run.
fn schedule(rng: &mut StdRng, secs: u64) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    for (fault, n) in SCHEDULE {
        for _ in 0..n {
            // Every fault that needs a publish still to come (a held write,
            // a pull-back of a post that could still be picked, an open slot
            // for backfill) in the first two fifths, while the caps leave
            // publishes to make (they fill about halfway through); the
            // duplicates of finished slots anywhere in three quarters.
            let end = match fault {
                Fault::TriggerDup | Fault::XaddDup => secs * 1000 * 3 / 4,
                _ => secs * 1000 * 2 / 5,
            };
            let at_ms = rng.gen_range(500..end);
            events.push(Event { at_ms, fault });
        }
    }
    // The backfill right after the kill, while the fleet is down.
    let kill = events
        .iter()
        .find(|e| e.fault == Fault::WpKillMidWrite)
        .map(|e| e.at_ms);
    for e in events.iter_mut().filter(|e| e.fault == Fault::BackfillDup) {
        e.at_ms = kill.map_or(e.at_ms, |k| k + 1);
    }
    events.sort_by_key(|e| e.at_ms);
    events
}

/// Every slot's gate row of both kinds, with its draft's URL and CMS id.
async fn slot_rows(pool: &sqlx::PgPool) -> Result<Vec<SlotRow>> {
    Ok(sqlx::query_as::<_, (String, String, String, Option<String>, Option<String>, Option<i64>)>(
        "SELECT s.kind, s.kind || ':' || s.day::text || ':' || s.slot, s.state, s.reason, d.url, d.cms_id \
         FROM publish_slot s LEFT JOIN draft d ON d.id = s.post_id WHERE s.kind = ANY($1) ORDER BY s.kind, s.slot",
    )
    .bind([ARTICLE, NEWS])
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|(kind, slot, state, reason, url, cms_id)| SlotRow {
        kind,
        slot,
        state,
        reason,
        url,
        cms_id,
    })
    .collect())
}

/// Prints the slots' outcomes, WordPress's counts, the faults and the
/// violations, then the run's last line and (with `--json`) its summary;
/// returns how the run ended.
fn report(
    o: &Options,
    verdict: &Verdict,
    records: &[Record],
    rows: &[SlotRow],
    transitions: &[WpTransition],
    held: u32,
) -> Outcome {
    let mut outcomes: BTreeMap<(String, String), usize> = BTreeMap::new();
    for row in rows {
        let what = match &row.reason {
            Some(reason) => format!("{} ({reason})", row.state),
            None => row.state.clone(),
        };
        *outcomes.entry((row.kind.clone(), what)).or_default() += 1;
    }
    println!("slots:");
    for ((kind, what), n) in &outcomes {
        println!("  {kind:<11} {what:<28} {n:>3}");
    }
    let saves_publish = transitions
        .iter()
        .filter(|t| t.op == WpOp::Save && t.to == "publish")
        .count();
    let reads = transitions.iter().filter(|t| t.op == WpOp::Read).count();
    println!(
        "WordPress: {} posts published in place, {} created, {saves_publish} saves to publish, {reads} one-post reads, {held} writes held; {} pull-backs raced a write",
        verdict.published_in_place,
        verdict.created,
        verdict.raced.len()
    );
    println!(
        "WordPress: staged copies never published: {} (trashed: {}, left as drafts: {})",
        verdict.staged_copies,
        verdict.staged_trashed,
        verdict.staged_copies - verdict.staged_trashed
    );
    if !verdict.unmarked.is_empty() {
        println!(
            "WordPress: {NEWS} posts whose slug is no slot's marker (not placed by slot): {:?}",
            verdict.unmarked
        );
    }
    println!("faults:");
    let scheduled: Vec<Fault> = SCHEDULE
        .iter()
        .flat_map(|(f, n)| std::iter::repeat_n(*f, *n))
        .collect();
    let done: Vec<FaultRecord> = records
        .iter()
        .map(|r| FaultRecord {
            fault: r.fault,
            affected: Default::default(),
            injected: r.injected,
            verified: r.verified,
        })
        .collect();
    let by_fault = crate::judge::fault_counts(&scheduled, &done, &[]);
    for f in &by_fault {
        println!(
            "  {:<20} scheduled {}, injected {}, verified {}",
            f.fault.name(),
            f.scheduled,
            f.injected,
            f.verified
        );
    }
    for rec in records.iter().filter(|x| !x.injected || !x.verified) {
        println!(
            "  could not inject or verify {}: {}",
            rec.fault.name(),
            rec.detail
        );
    }
    if !verdict.violations.is_empty() {
        println!("\nviolations:");
        for v in &verdict.violations {
            println!("  {v}");
        }
    }
    let injected = crate::judge::all_injected(&by_fault);
    let outcome = Outcome::of(injected, verdict.violations.is_empty());
    let counts: Vec<(&str, usize)> = Class::WORDPRESS
        .iter()
        .map(|c| (c.name(), verdict.count(*c)))
        .collect();
    outcome.print_line(o.seed, &counts, verdict.violations.len());
    if o.json {
        let classes: serde_json::Map<String, serde_json::Value> = counts
            .iter()
            .map(|(c, n)| ((*c).to_owned(), (*n).into()))
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "cms": "wordpress",
                "seed": o.seed,
                "pass": matches!(outcome, Outcome::Pass),
                "all_injected": injected,
                "violations": classes,
                "faults": by_fault.iter().map(crate::judge::FaultCount::json).collect::<Vec<_>>(),
                "published_in_place": verdict.published_in_place,
                "created": verdict.created,
                "staged_copies": verdict.staged_copies,
                "staged_trashed": verdict.staged_trashed,
                "unmarked": verdict.unmarked.len(),
                "raced": verdict.raced.len(),
                "held_writes": held,
                "saves_to_publish": saves_publish,
            })
        );
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: i64, op: WpOp, from: &str, to: &str, at: i64) -> WpTransition {
        WpTransition {
            id,
            op,
            from: from.into(),
            to: to.into(),
            at,
        }
    }

    fn post(id: i64, status: &str, title: &str) -> WpPost {
        WpPost {
            id,
            status: status.into(),
            slug: format!("p{id}"),
            title: title.into(),
            date_gmt: String::new(),
            link: format!("http://wp/p{id}/"),
        }
    }

    fn row(slot: &str, state: &str, url: Option<&str>) -> SlotRow {
        SlotRow {
            kind: ARTICLE.into(),
            slot: slot.into(),
            state: state.into(),
            reason: None,
            url: url.map(Into::into),
            cms_id: None,
        }
    }

    /// A history where ready posts 1..=7 are published once each, post 8 is
    /// pulled back and never published: no violation. Each test below
    /// breaks one rule of it.
    struct Case {
        ready: Vec<i64>,
        withdrawn: Vec<i64>,
        transitions: Vec<WpTransition>,
        posts: Vec<WpPost>,
        rows: Vec<SlotRow>,
    }

    fn clean() -> Case {
        let ready: Vec<i64> = (1..=10).collect();
        let mut transitions = Vec::new();
        let mut posts = Vec::new();
        let mut rows = Vec::new();
        for id in 1..=7 {
            transitions.push(t(id, WpOp::Read, "pending", "pending", id * 10));
            transitions.push(t(id, WpOp::Save, "pending", "publish", id * 10 + 1));
            posts.push(post(id, "publish", "x"));
            rows.push(row(
                &format!("a:{id}"),
                "published",
                Some(&format!("http://wp/p{id}/")),
            ));
        }
        for id in 8..=10 {
            transitions.push(t(id, WpOp::Save, "pending", "draft", 100 + id));
            posts.push(post(id, "draft", "x"));
        }
        Case {
            ready,
            withdrawn: vec![8, 9, 10],
            transitions,
            posts,
            rows,
        }
    }

    fn judge_case(c: &Case, news: &[String]) -> Verdict {
        judge_news(c, news, &[])
    }

    fn judge_news(c: &Case, news: &[String], markers: &[(String, String)]) -> Verdict {
        judge(&Evidence {
            ready: &c.ready,
            not_ready: &[],
            withdrawn: &c.withdrawn,
            unpublished: &[],
            news_titles: news,
            news_markers: markers,
            transitions: &c.transitions,
            posts: &c.posts,
            rows: &c.rows,
            settled: true,
            unclean_exits: &[],
        })
    }

    #[test]
    fn a_clean_history_passes() {
        let v = judge_case(&clean(), &[]);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.published_in_place, 7);
    }

    #[test]
    fn a_second_save_as_publish_is_doubled() {
        let mut c = clean();
        c.transitions
            .push(t(3, WpOp::Save, "publish", "publish", 500));
        let v = judge_case(&c, &[]);
        assert_eq!(v.count(Class::Doubled), 1, "{:?}", v.violations);
    }

    #[test]
    fn a_publish_after_a_pull_back_is_a_violation_unless_it_raced_a_read() {
        let mut c = clean();
        // Read after the pull-back, then written: the worker saw `draft`.
        c.transitions.push(t(8, WpOp::Read, "draft", "draft", 200));
        c.transitions
            .push(t(8, WpOp::Save, "draft", "publish", 201));
        let v = judge_case(&c, &[]);
        assert_eq!(v.count(Class::WithdrawnPublished), 1, "{:?}", v.violations);
        // Read before the pull-back, written after: the documented race.
        let mut c = clean();
        let i = c.transitions.iter().position(|x| x.id == 9).unwrap();
        c.transitions
            .insert(i, t(9, WpOp::Read, "pending", "pending", 50));
        c.transitions
            .push(t(9, WpOp::Save, "draft", "publish", 300));
        let v = judge_case(&c, &[]);
        assert_eq!(v.count(Class::WithdrawnPublished), 0, "{:?}", v.violations);
        assert_eq!(v.raced, vec![9]);
    }

    #[test]
    fn too_few_publishes_are_lost_and_unrecorded_ones_phantom() {
        let mut c = clean();
        c.transitions.retain(|x| x.id != 7);
        c.rows.pop();
        c.posts[6].status = "pending".into();
        let v = judge_case(&c, &[]);
        assert_eq!(v.count(Class::Lost), 1, "{:?}", v.violations);
        let mut c = clean();
        c.rows.pop();
        let v = judge_case(&c, &[]);
        assert_eq!(v.count(Class::Phantom), 1, "{:?}", v.violations);
        let mut c = clean();
        c.rows[0].url = Some("http://wp/elsewhere/".into());
        let v = judge_case(&c, &[]);
        assert!(v.count(Class::Phantom) >= 1, "{:?}", v.violations);
    }

    /// The clean case plus the creating kind: drafts `n0`..`n5`, each
    /// staged (`new -> draft`) and published by a status change under its
    /// slot's marker `m<i>`, and recorded by its slot.
    fn with_news() -> (Case, Vec<String>, Vec<(String, String)>) {
        let mut c = clean();
        let news: Vec<String> = (0..NEWS_CAP).map(|i| format!("n{i}")).collect();
        let markers: Vec<(String, String)> = (0..NEWS_SLOTS)
            .map(|i| (format!("wp-news:d:{i}"), format!("wp-news-d-{i}-0a1b2c3d")))
            .collect();
        for (i, title) in news.iter().enumerate() {
            let id = 100 + i as i64;
            let slug = &markers[i].1;
            c.transitions
                .push(t(id, WpOp::Save, "new", "draft", 1000 + id));
            c.transitions
                .push(t(id, WpOp::Save, "draft", "publish", 1001 + id));
            c.posts.push(news_post(id, "publish", title, slug));
            c.rows.push(row(
                &markers[i].0,
                "published",
                Some(&format!("http://wp/{slug}/")),
            ));
        }
        (c, news, markers)
    }

    fn news_post(id: i64, status: &str, title: &str, slug: &str) -> WpPost {
        WpPost {
            slug: slug.into(),
            link: format!("http://wp/{slug}/"),
            ..post(id, status, title)
        }
    }

    #[test]
    fn extra_staged_copies_that_never_went_out_pass_and_are_counted() {
        let (mut c, news, markers) = with_news();
        let v = judge_news(&c, &news, &markers);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!((v.created, v.staged_copies), (NEWS_CAP, 0));
        assert!(v.unmarked.is_empty(), "{:?}", v.unmarked);
        // A create queued past the timeout, saved after the slot's post was
        // published: a draft with the marker, never published.
        let m0 = markers[0].1.clone();
        c.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        c.posts.push(news_post(300, "draft", "n0", &m0));
        // A repeated create resolved away: staged, then trashed.
        c.transitions.push(t(301, WpOp::Save, "new", "draft", 3001));
        c.transitions
            .push(t(301, WpOp::Save, "draft", "trash", 3002));
        c.posts.push(news_post(
            301,
            "trash",
            "n1",
            &format!("{}__trashed", markers[1].1),
        ));
        let v = judge_news(&c, &news, &markers);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.created, NEWS_CAP);
        assert_eq!((v.staged_copies, v.staged_trashed), (2, 1));
    }

    #[test]
    fn two_posts_that_went_out_for_one_draft_are_created_twice() {
        let (mut c, news, markers) = with_news();
        // A second copy of n0 published (WordPress gave it `-2`).
        c.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        c.transitions
            .push(t(300, WpOp::Save, "draft", "publish", 3001));
        c.posts.push(news_post(
            300,
            "publish",
            "n0",
            &format!("{}-2", markers[0].1),
        ));
        let v = judge_news(&c, &news, &markers);
        // One violation for the pair, though both the draft and the slot
        // name it.
        assert_eq!(v.count(Class::CreatedTwice), 1, "{:?}", v.violations);
        // Published and then trashed: it went out all the same.
        let (mut c, news, markers) = with_news();
        c.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        c.transitions
            .push(t(300, WpOp::Save, "draft", "publish", 3001));
        c.transitions
            .push(t(300, WpOp::Save, "publish", "trash", 3002));
        c.posts.push(news_post(
            300,
            "trash",
            "n0",
            &format!("{}__trashed", markers[0].1),
        ));
        let v = judge_news(&c, &news, &markers);
        assert_eq!(v.count(Class::CreatedTwice), 1, "{:?}", v.violations);
        assert_eq!(v.staged_copies, 0);
    }

    #[test]
    fn two_posts_that_went_out_for_one_slot_are_created_twice() {
        let (mut c, mut news, markers) = with_news();
        // Another draft published under slot 0's marker: each draft went
        // out once, the slot twice.
        news.push("n-other".into());
        c.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        c.transitions
            .push(t(300, WpOp::Save, "draft", "publish", 3001));
        c.posts.push(news_post(
            300,
            "publish",
            "n-other",
            &format!("{}-2", markers[0].1),
        ));
        let v = judge_news(&c, &news, &markers);
        assert_eq!(v.count(Class::CreatedTwice), 1, "{:?}", v.violations);
        assert!(
            v.violations
                .iter()
                .any(|x| x.detail.contains(&markers[0].0)),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn a_slug_is_its_slots_only_as_the_marker_or_wordpress_forms_of_it() {
        let markers = vec![
            ("s1".to_owned(), "wp-news-d-1-0a1b2c3d".to_owned()),
            ("s10".to_owned(), "wp-news-d-10-0a1b2c3d".to_owned()),
        ];
        for (slug, slot) in [
            ("wp-news-d-1-0a1b2c3d", Some("s1")),
            ("wp-news-d-1-0a1b2c3d-2", Some("s1")),
            ("wp-news-d-1-0a1b2c3d__trashed", Some("s1")),
            ("wp-news-d-1-0a1b2c3d-3__trashed", Some("s1")),
            ("wp-news-d-10-0a1b2c3d", Some("s10")),
            ("wp-news-d-1-0a1b2c3d-x", None),
            ("wp-news-d-1-0a1b2c3", None),
            ("wp-news-d-1-0a1b2c3d-", None),
            ("p7", None),
        ] {
            assert_eq!(slot_of_slug(slug, &markers), slot, "{slug}");
        }
    }

    #[test]
    fn a_held_create_is_traced_by_its_late_save_after_another_copy() {
        let news = vec!["n0".to_owned(), "n1".to_owned()];
        let held_at = 1_000_000_000;
        let s = 1_000_000;
        let posts = vec![
            post(1, "publish", "n0"),
            post(2, "draft", "n0"),
            post(3, "publish", "n1"),
        ];
        // n0: the retry's copy (1) saved 2.5 s after the hold, the held one
        // (2) 5.1 s after it.
        let trace = vec![
            t(1, WpOp::Save, "new", "draft", held_at + 5 * s / 2),
            t(2, WpOp::Save, "new", "draft", held_at + 51 * s / 10),
            t(3, WpOp::Save, "new", "draft", held_at + 6 * s),
        ];
        assert_eq!(
            held_create_trace(held_at, &trace, &posts, &news),
            Some((2, 1))
        );
        // Saved too soon to have waited out the hold.
        let mut soon = trace.clone();
        soon[1].at = held_at + 3 * s;
        assert_eq!(held_create_trace(held_at, &soon, &posts, &news), None);
        // A late save with no other copy of its draft before it (post 3,
        // another slot's ordinary create) is not the trace.
        let alone = vec![trace[0].clone(), trace[2].clone()];
        assert_eq!(held_create_trace(held_at, &alone, &posts, &news), None);
        // Not a creating-kind draft.
        assert_eq!(held_create_trace(held_at, &trace, &posts, &[]), None);
    }
}
