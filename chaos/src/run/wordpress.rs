//! The WordPress scenario's site and faults (`--cms wordpress`): a real,
//! throwaway WordPress (testkit's) with the editors' posts in it, the
//! kinds' config pointing at it, and the faults only a WordPress can take
//! (the schedule's table, `scenario::wordpress::SCHEDULE`, says what each
//! does; docs/chaos.md how each is verified): WordPress holding a write
//! after its save or a create before it, every worker killed mid-write, an
//! editor pulling a ready post back. Its duplicates are the main run's
//! callers ([`super::duplicate`]) but for two XADDs of a due slot at once
//! as `manual` and `planner`, callers slotgate treats differently. Held
//! creates and added entries leave their trace only later: [`verify`]
//! checks it after the run. The run loop, the settle, the judge and the
//! report are the one run's; [`Site::witness`] reads WordPress's records
//! for the judge.

use super::{duplicate, Harness, Injection};
use crate::judge::wordpress::{SlotRow, Witness};
use crate::model::{Expect, Fault, PlanSlot};
use crate::scenario::wordpress::{
    ARTICLE, ARTICLE_CAP, NEWS, NEWS_CAP, NEWS_DRAFTS, NOT_READY, READY,
};
use crate::scenario::{Scenario, Target, WpDrafts};
use crate::stack::Stack;
use anyhow::{bail, Context, Result};
use chrono::{Duration as CDuration, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::server::{OwnedWordPress, WpOp, WpPost, WpTransition};

/// The kinds' `http_timeout`, and how long a held write waits before
/// WordPress answers (well past the timeout: the answer is lost).
const HTTP_TIMEOUT: &str = "2s";
const HOLD_SECONDS: u64 = 5;
/// How many REST creates one `wp-held-before-save` holds before their save
/// at most (the first try's and, usually, its retry's).
const HELD_CREATES: u32 = 2;
/// The environment variable that carries the application password.
const PASSWORD_ENV: &str = "CHAOS_WP_PASSWORD";

/// The WordPress of a run and what the run did to it.
pub struct Site {
    wp: Arc<OwnedWordPress>,
    seed: u64,
    /// The in-place kind's ready posts and plain drafts.
    ready: Vec<i64>,
    not_ready: Vec<i64>,
    news_titles: Vec<String>,
    /// Chooses the slots the duplicates and the backfill take.
    rng: Mutex<StdRng>,
    withdrawn: Mutex<Vec<i64>>,
    /// Posts the editor's pull-back reached only after slotgate had
    /// published them.
    unpublished: Mutex<Vec<i64>>,
    /// Worker slots `wp-kill-mid-write` stopped, for the backfill to start.
    down: Mutex<Vec<usize>>,
    /// Each `wp-held-before-save`, in order: when the harness saw the
    /// first create held (µs since the epoch, the clock WordPress's log
    /// uses) and how many creates it held.
    held_before_save: Mutex<Vec<(i64, u32)>>,
}

impl Site {
    /// Starts the WordPress and writes the editors' posts: ready ones
    /// dated on the January `days` given (so that WordPress's "oldest
    /// first" differs from id order), and plain drafts.
    pub async fn launch(seed: u64, days: &[u32]) -> Result<Site> {
        let wp = tokio::task::spawn_blocking(OwnedWordPress::launch)
            .await?
            .context(
            "starting the test WordPress (Debian's wordpress, mariadb-server, php-cli, php-mysql)",
        )?;
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
        println!(
            "CMS: a real WordPress at {}; {ARTICLE}: {READY} ready posts + {NOT_READY} plain drafts in it; {NEWS}: {NEWS_DRAFTS} drafts in slotgate. Its posts before:\n{}",
            wp.url(),
            render_posts(&wp.posts().await)
        );
        Ok(Site {
            wp: Arc::new(wp),
            seed,
            ready,
            not_ready,
            news_titles: (0..NEWS_DRAFTS).map(|i| format!("News item {i}")).collect(),
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)),
            withdrawn: Mutex::default(),
            unpublished: Mutex::default(),
            down: Mutex::default(),
            held_before_save: Mutex::default(),
        })
    }

    /// The environment every slotgate process gets: the password.
    pub fn envs(&self) -> [(&str, &str); 1] {
        [(PASSWORD_ENV, self.wp.admin().1)]
    }

    /// The config of the scenario's kinds, for a window starting `lead`
    /// from now, every kind at WordPress.
    pub fn write_config(&self, stack: &mut Stack, sc: &Scenario, lead: Duration) -> Result<()> {
        let zone = stack.open_window(lead, sc.duration)?;
        let base = stack.base;
        let mut toml = format!("jitter_seed = \"{}\"\n", self.jitter_seed());
        for k in &sc.kinds {
            let slots: Vec<String> = k
                .offsets
                .iter()
                .map(|s| format!("\"{}\"", zone.hms(base + CDuration::seconds(*s as i64))))
                .collect();
            let (url, user) = (self.wp.url(), self.wp.admin().0);
            let _ = writeln!(
                toml,
                "\n[[kinds]]\nname = \"{}\"\ntimezone = \"{}\"\nslots = [{}]\n\
                 jitter = \"1s\"\ndaily_cap = {}\nstarting_deadline = \"1h\"\n\
                 http_timeout = \"{HTTP_TIMEOUT}\"\nhttp_attempts = 6\nretry_base = \"50ms\"\nretry_cap = \"1s\"\n\
                 [kinds.wordpress]\nurl = \"{url}\"\nuser = \"{user}\"\n\
                 app_password_env = \"{PASSWORD_ENV}\"\nrefresh_every = \"0s\"",
                k.name,
                stack.zone,
                slots.join(", "),
                k.daily_cap
            );
            if k.wordpress == Some(WpDrafts::InWordPress) {
                let _ = writeln!(toml, "drafts = \"pending\"");
            }
        }
        std::fs::write(&stack.kit.config, toml).context("writing the config")
    }

    /// slotgate's own drafts (the creating kind's); no `planner drafts
    /// sync`: the workers must see WordPress's drafts on their own.
    pub fn drafts(&self) -> Vec<serde_json::Value> {
        self.news_titles
            .iter()
            .map(|t| serde_json::json!({"kind": NEWS, "title": t, "body": format!("<p>{t}</p>")}))
            .collect()
    }

    fn jitter_seed(&self) -> String {
        format!("chaos-wp-{}", self.seed)
    }

    /// What WordPress recorded, for the judge (the posts after the run
    /// printed).
    pub async fn witness(&self, h: &Harness) -> Result<Witness> {
        let posts = self.wp.posts().await;
        println!("\nWordPress posts after:\n{}", render_posts(&posts));
        let rows = slot_rows(&h.stack.kit.pool).await?;
        Ok(Witness {
            ready: self.ready.clone(),
            not_ready: self.not_ready.clone(),
            withdrawn: self.withdrawn.lock().unwrap().clone(),
            unpublished: self.unpublished.lock().unwrap().clone(),
            news_titles: self.news_titles.clone(),
            news_markers: markers(&h.planned(), &self.jitter_seed())?,
            caps: (ARTICLE_CAP, NEWS_CAP),
            transitions: self.wp.transitions(),
            posts,
            rows,
            held_writes: self.wp.held_writes(),
        })
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

    /// The editor pulls back a ready post, as `fault` says; the post's
    /// id, and whether WordPress logged the change from `pending` to the
    /// status `fault` leaves. The post is the third oldest ready one that
    /// slotgate has not bound to a slot (the oldest are the next to be
    /// published, and WordPress has no conditional update, so a pull-back
    /// of a post being published races the write). Should slotgate
    /// publish it between the choice and the change all the same
    /// (WordPress's record says the change came from `publish`), that post
    /// is set aside as the editor's unpublishing and another is pulled
    /// back.
    async fn withdraw(&self, h: &Harness, fault: Fault) -> Result<(i64, bool)> {
        let to = match fault {
            Fault::EditorDraft => "draft",
            Fault::EditorTrash => "trash",
            _ => "deleted",
        };
        for _ in 0..5 {
            let bound: HashSet<i64> = sqlx::query_scalar(
                "SELECT cms_id FROM draft WHERE kind = $1 AND cms_id IS NOT NULL AND status <> 'ready'",
            )
            .bind(ARTICLE)
            .fetch_all(&h.stack.kit.pool)
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
            let change = self
                .wp
                .transitions()
                .into_iter()
                .rfind(|t| t.id == p.id && t.op != WpOp::Read);
            if change.as_ref().is_some_and(|t| t.from == "pending") {
                self.withdrawn.lock().unwrap().push(p.id);
                return Ok((p.id, change.is_some_and(|t| t.to == to)));
            }
            self.unpublished.lock().unwrap().push(p.id);
        }
        bail!("every pull-back came after slotgate had published the post")
    }

    /// A planned slot, chosen by the site's RNG among those `pick` keeps.
    fn choose(&self, h: &Harness, pick: impl Fn(&PlanSlot) -> bool) -> Option<Target> {
        let keys: Vec<PlanSlot> = h.plan.iter().filter(|p| pick(p)).cloned().collect();
        if keys.is_empty() {
            return None;
        }
        let p = &keys[self.rng.lock().unwrap().gen_range(0..keys.len())];
        let kind = h.sc.kinds.iter().position(|k| k.name == p.kind)?;
        let slot_no = p.slot.rsplit(':').next()?.parse().ok()?;
        Some(Target { kind, slot_no })
    }

    /// A slot with an outcome, waiting up to `within` for one.
    async fn finished_slot(&self, h: &Harness, within: Duration) -> Result<Target> {
        let deadline = Instant::now() + within;
        loop {
            let done = h.terminal.borrow().clone();
            if let Some(t) = self.choose(h, |p| done.contains(&p.slot)) {
                return Ok(t);
            }
            if Instant::now() >= deadline {
                bail!("no slot finished within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Now, in microseconds since the Unix epoch (as WordPress's log).
fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Injects one of the WordPress scenario's faults ([`crate::scenario::Ev::WordPress`]).
pub(super) async fn inject(h: &Arc<Harness>, fault: Fault, until: Instant) -> Result<Injection> {
    let Some(site) = &h.site else {
        bail!("{} needs --cms wordpress", fault.name());
    };
    let window_end = h.t0 + h.sc.duration;
    let within = (window_end + Duration::from_secs(10))
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(5));
    let none = HashSet::new;
    match fault {
        Fault::WpAppliedLost => {
            let (_, n) = site.hold_next(false, within).await?;
            Ok(Injection::new(
                none(),
                format!("a write held {HOLD_SECONDS} s after WordPress saved it"),
                n >= 1,
            ))
        }
        Fault::WpKillMidWrite => {
            let (_, n) = site.hold_next(false, within).await?;
            let mut procs = Vec::new();
            {
                let mut w = h.workers.lock().unwrap();
                for s in w.iter_mut() {
                    if let Some(p) = s.proc.take() {
                        s.gen += 1;
                        procs.push((s.idx, p));
                    }
                }
            }
            // Started again by the backfill that follows (while the fleet
            // is down, a due slot has no outcome yet: the backfill has
            // something to deliver twice).
            *site.down.lock().unwrap() = procs.iter().map(|(i, _)| *i).collect();
            let mut killed = true;
            for (_, p) in &mut procs {
                killed &= p.kill_9().is_ok();
            }
            Ok(Injection::new(
                none(),
                format!(
                    "a write held, then all {} workers killed with SIGKILL{}",
                    procs.len(),
                    if killed {
                        ""
                    } else {
                        " (one had already exited)"
                    }
                ),
                n >= 1 && killed,
            ))
        }
        Fault::WpHeldBeforeSave => {
            let (at, n) = site.hold_next(true, within).await?;
            site.held_before_save.lock().unwrap().push((at, n));
            // Verified after the run, by [`verify`], when its trace is in.
            Ok(Injection {
                later: true,
                ..Injection::new(
                    none(),
                    format!("{n} REST create(s) held {HOLD_SECONDS} s before WordPress saved them"),
                    false,
                )
            })
        }
        Fault::EditorDraft | Fault::EditorTrash | Fault::EditorDelete => {
            let (id, logged) = site.withdraw(h, fault).await?;
            Ok(Injection::new(none(), format!("post {id}"), logged))
        }
        Fault::TriggerDup => {
            let t = site.finished_slot(h, within).await?;
            duplicate::trigger(h, t, 0, until).await
        }
        Fault::XaddDup => {
            let t = site.finished_slot(h, within).await?;
            duplicate::xadd(h, t, 0, until).await
        }
        Fault::ConcurrentDup => {
            let t = loop {
                let now = Utc::now();
                if let Some(t) = site.choose(h, |p| p.due_at <= now) {
                    break t;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let key = h.sc.target_key(t, &h.stack.day);
            let done = h.terminal.borrow().contains(&key);
            let manual = [("slot", key.as_str()), ("caller", "manual")];
            let planner = [("slot", key.as_str()), ("caller", "planner")];
            let (a, b) = tokio::join!(h.xadd(&manual), h.xadd(&planner));
            let ids = [a?, b?];
            h.added(
                fault,
                if done { Expect::Taken } else { Expect::Any },
                ids.iter().map(|id| (Some(id.clone()), Some(key.clone()))),
            );
            Ok(Injection::new(
                HashSet::from([key.clone()]),
                format!("two XADDs of {key} at once (manual, planner): entries {ids:?}"),
                true,
            ))
        }
        Fault::BackfillDup => {
            let kind = site.rng.lock().unwrap().gen_range(0..h.sc.kinds.len());
            let res = duplicate::backfill(h, kind, until).await;
            let down = std::mem::take(&mut *site.down.lock().unwrap());
            {
                let mut w = h.workers.lock().unwrap();
                for idx in &down {
                    let s = &mut w[*idx];
                    let id = format!("w{}g{}", idx + 1, s.gen);
                    s.proc = Some(h.stack.spawn_worker(&id, &id, s.clock_ahead));
                    s.id = id;
                }
            }
            let mut i = res?;
            if !down.is_empty() {
                i.what = format!(
                    "while the workers were down, {}; {} workers restarted",
                    i.what,
                    down.len()
                );
            }
            Ok(i)
        }
        f => bail!("{} is not a fault of the WordPress scenario", f.name()),
    }
}

/// After the run: each added duplicate entry has its execution row, and
/// each `wp-held-before-save` left its trace in WordPress's records
/// ([`held_create_trace`]); a fault without is marked not verified.
pub async fn verify(h: &Harness, site: &Site) -> Result<()> {
    let entries: Vec<(Fault, String)> = h
        .records
        .lock()
        .unwrap()
        .deliveries
        .iter()
        .filter_map(|d| Some((d.fault, d.entry.clone()?)))
        .collect();
    let mut executed: HashMap<Fault, bool> = HashMap::new();
    for (fault, entry) in entries {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE entry_id = $1")
            .bind(&entry)
            .fetch_one(&h.stack.kit.pool)
            .await?;
        *executed.entry(fault).or_insert(true) &= n > 0;
    }
    let transitions = site.wp.transitions();
    let posts = site.wp.posts().await;
    let mut held = site.held_before_save.lock().unwrap().clone().into_iter();
    let mut r = h.records.lock().unwrap();
    for rec in r.faults.iter_mut().filter(|x| x.injected) {
        match rec.fault {
            Fault::TriggerDup | Fault::XaddDup | Fault::ConcurrentDup => {
                rec.verified &= executed.get(&rec.fault) == Some(&true);
            }
            Fault::WpHeldBeforeSave => {
                let Some((at, n)) = held.next() else {
                    continue;
                };
                let trace = held_create_trace(at, &transitions, &posts, &site.news_titles);
                match trace {
                    Some((late, other)) => println!(
                        "  wp-held-before-save: {n} create(s) held; post {late} saved {HOLD_SECONDS} s later, after post {other} of the same draft"
                    ),
                    None => println!(
                        "  wp-held-before-save: {n} create(s) held, but no copy of a {NEWS} draft was saved {HOLD_SECONDS} s later after another copy"
                    ),
                }
                rec.verified = n >= 1 && trace.is_some();
            }
            _ => {}
        }
    }
    Ok(())
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

/// The creating kind's slots and their markers, as the workers make them
/// (the default slug template, the config's `jitter_seed`): how the judge
/// tells which slot a post is, whatever its title.
fn markers(plan: &[PlanSlot], jitter_seed: &str) -> Result<Vec<(String, String)>> {
    let template = slotgate::config::SlugTemplate::parse(slotgate::config::DEFAULT_SLUG)
        .map_err(|e| anyhow::anyhow!("the default slug template: {e}"))?;
    let tag = slotgate::receiver::wordpress::marker_tag(jitter_seed, NEWS);
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::judge::wordpress::tests::post;

    /// A creation's save at `at`.
    fn t(id: i64, at: i64) -> WpTransition {
        crate::judge::wordpress::tests::t(id, WpOp::Save, "new", "draft", at)
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
            t(1, held_at + 5 * s / 2),
            t(2, held_at + 51 * s / 10),
            t(3, held_at + 6 * s),
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
