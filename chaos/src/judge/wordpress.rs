//! The WordPress witness (`--cms wordpress`): the WordPress kinds' effects
//! judged by WordPress's own records — its posts table and the status
//! changes (and one-post REST reads) a must-use plugin logs as WordPress
//! saves them — not by anything slotgate says; slotgate's rows are what is
//! checked against them. Its classes (each rule at its check below, and in
//! docs/chaos.md): `doubled`, `created_twice`, `withdrawn_published`,
//! `not_ready_published`, `lost`, `phantom`, `failed`. Two rules leave a
//! documented margin: a pull-back that landed between slotgate's read of a
//! post and its write (WordPress has no conditional update) is counted as
//! `raced`, and staged copies that were never published (what
//! stage-then-publish leaves behind, seen by nobody) as `staged copies`.
//! Whether the run settled, the workers' exits, the deliveries, what was
//! left pending and each slot's one outcome are the one judge's checks,
//! as for every kind.

use super::Verdict;
use crate::model::Class;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use testkit::server::{WpOp, WpPost, WpTransition};

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

/// What WordPress recorded, and what the run knows of its posts.
#[derive(Debug, Default)]
pub struct Witness {
    /// Posts of the in-place kind that were ready at the start.
    pub ready: Vec<i64>,
    /// Posts that were never ready.
    pub not_ready: Vec<i64>,
    /// Posts the editor pulled back (by id) while they were ready.
    pub withdrawn: Vec<i64>,
    /// Posts the editor meant to pull back that slotgate had published by
    /// then (the editor's change came second).
    pub unpublished: Vec<i64>,
    /// Titles of the creating kind's drafts.
    pub news_titles: Vec<String>,
    /// The creating kind's slots and their markers: (slot key, marker).
    pub news_markers: Vec<(String, String)>,
    /// The caps of the in-place and of the creating kind.
    pub caps: (usize, usize),
    pub transitions: Vec<WpTransition>,
    /// The posts table after the run.
    pub posts: Vec<WpPost>,
    /// The WordPress kinds' gate rows, with their drafts' links.
    pub rows: Vec<SlotRow>,
    /// Writes WordPress held (its plugin's count).
    pub held_writes: u32,
}

/// What the witness counted, for the report and (all but the outcomes)
/// the `--json` object's `wordpress`.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Tally {
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
    /// The slots' outcomes: (kind, state and reason) → count.
    #[serde(skip)]
    pub outcomes: BTreeMap<(String, String), usize>,
    pub saves_to_publish: usize,
    pub reads: usize,
    pub held_writes: u32,
}

impl Tally {
    /// Its part of the report.
    pub fn report(&self, out: &mut String) {
        let _ = writeln!(out, "\nWordPress kinds' slots:");
        for ((kind, what), n) in &self.outcomes {
            let _ = writeln!(out, "  {kind:<11} {what:<28} {n:>3}");
        }
        let _ = writeln!(
            out,
            "WordPress: {} posts published in place, {} created, {} saves to publish, {} one-post reads, {} writes held; pull-backs that raced a write: {:?}",
            self.published_in_place,
            self.created,
            self.saves_to_publish,
            self.reads,
            self.held_writes,
            self.raced
        );
        let _ = writeln!(
            out,
            "WordPress: staged copies never published: {} (trashed: {}, left as drafts: {}); creating-kind posts whose slug is no slot's marker: {:?}",
            self.staged_copies,
            self.staged_trashed,
            self.staged_copies - self.staged_trashed,
            self.unmarked
        );
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

/// Judges the WordPress kinds by WordPress's records, adding to `v`;
/// `settled`: only a settled run can be short of publishes.
pub(super) fn judge(w: &Witness, settled: bool, v: &mut Verdict) -> Tally {
    // Publishes short of what the caps and the drafts allow: the
    // verdict's `lost` counts effects, not violations.
    let mut lost_effects = 0;
    let mut bad = |c: Class, slot: Option<&str>, m: String| v.add(c, slot, m);
    // Each post's history, in WordPress's order.
    let mut history: BTreeMap<i64, Vec<&WpTransition>> = BTreeMap::new();
    for t in &w.transitions {
        history.entry(t.id).or_default().push(t);
    }
    for (id, h) in &history {
        let n = h.iter().filter(|t| saved_publish(t)).count();
        if n > 1 {
            bad(
                Class::Doubled,
                None,
                format!("post {id} was saved as publish {n} times"),
            );
        }
    }
    let published_ever = |id: i64| {
        history
            .get(&id)
            .is_some_and(|h| h.iter().any(|t| saved_publish(t)))
    };
    for id in &w.not_ready {
        if published_ever(*id) {
            bad(
                Class::NotReadyPublished,
                None,
                format!("post {id} was never ready and was published"),
            );
        }
    }
    let mut withdrawn_effective = 0;
    let mut raced = Vec::new();
    for id in &w.withdrawn {
        let h = history.get(id).map(Vec::as_slice).unwrap_or_default();
        // The editor's pull-back: a change away from the ready status.
        let Some(wi) = h.iter().position(|t| {
            t.op != WpOp::Read && t.from == "pending" && t.to != "pending" && t.to != "publish"
        }) else {
            continue;
        };
        withdrawn_effective += 1;
        let Some(p) = h[wi..]
            .iter()
            .position(|t| saved_publish(t))
            .map(|i| wi + i)
        else {
            continue;
        };
        // Published after the pull-back: tolerated only when the last read
        // before that write came before the pull-back (the write was
        // decided on a status that was still ready).
        let last_read = h[..p].iter().rposition(|t| t.op == WpOp::Read);
        if last_read.is_some_and(|r| r < wi) {
            raced.push(*id);
        } else {
            bad(
                Class::WithdrawnPublished,
                None,
                format!("post {id} was published after the editor pulled it back"),
            );
        }
    }
    let (article_cap, news_cap) = w.caps;
    let ready_published = w.ready.iter().filter(|id| published_ever(**id)).count();
    let expected = article_cap.min(w.ready.len() - withdrawn_effective + raced.len());
    if settled && ready_published < expected {
        lost_effects += expected - ready_published;
        bad(
            Class::Lost,
            None,
            format!("{ready_published} ready posts published, the cap and the ready posts allow {expected}"),
        );
    }
    // The creating kind's posts, by draft (each draft's title is its own)
    // and by slot (the marker slug). Only copies that went out count: a
    // staged copy that stayed a draft, or went to the trash unpublished,
    // was never seen by a reader.
    let is_news = |p: &WpPost| {
        w.news_titles.iter().any(|t| t == &p.title)
            || slot_of_slug(&p.slug, &w.news_markers).is_some()
    };
    let went_out = |p: &WpPost| p.status == "publish" || published_ever(p.id);
    let mut by_title: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut by_slot: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let (mut staged_copies, mut staged_trashed) = (0, 0);
    let mut unmarked = Vec::new();
    for p in w.posts.iter().filter(|p| is_news(p)) {
        if slot_of_slug(&p.slug, &w.news_markers).is_none() {
            unmarked.push(p.id);
        }
        if !went_out(p) {
            staged_copies += 1;
            staged_trashed += usize::from(p.status == "trash");
            continue;
        }
        by_title.entry(p.title.as_str()).or_default().push(p.id);
        if let Some(slot) = slot_of_slug(&p.slug, &w.news_markers) {
            by_slot.entry(slot).or_default().push(p.id);
        }
    }
    let mut reported: HashSet<Vec<i64>> = HashSet::new();
    for (title, ids) in &by_title {
        if ids.len() > 1 && reported.insert(ids.clone()) {
            bad(
                Class::CreatedTwice,
                None,
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
                Some(slot),
                format!("{} posts went out for the slot {slot}: {ids:?}", ids.len()),
            );
        }
    }
    let created = by_title.len();
    let news_expected = news_cap.min(w.news_titles.len());
    if settled && created < news_expected {
        lost_effects += news_expected - created;
        bad(
            Class::Lost,
            None,
            format!("{created} posts created, the cap and the drafts allow {news_expected}"),
        );
    }
    // slotgate's records against WordPress's.
    let live: HashMap<&str, &WpPost> = w
        .posts
        .iter()
        .filter(|p| p.status == "publish")
        .map(|p| (p.link.as_str(), p))
        .collect();
    let mut accounted = HashSet::new();
    for r in &w.rows {
        let slot = Some(r.slot.as_str());
        match r.state.as_str() {
            // A post the editor moved after slotgate published it (its
            // pull-back came too late) is the editor's doing.
            "published" if r.cms_id.is_some_and(|id| w.unpublished.contains(&id)) => {}
            "published" => match r.url.as_deref().and_then(|u| live.get(u)) {
                Some(p) => {
                    if !accounted.insert(p.id) {
                        bad(
                            Class::Phantom,
                            slot,
                            format!("{} records post {} that another slot records too", r.slot, p.id),
                        );
                    }
                }
                None => bad(
                    Class::Phantom,
                    slot,
                    format!(
                        "{} is recorded published at {:?}, which WordPress does not show as a published post",
                        r.slot, r.url
                    ),
                ),
            },
            "failed" => bad(
                Class::Failed,
                slot,
                format!("{} failed ({})", r.slot, r.reason.as_deref().unwrap_or("?")),
            ),
            // Any other state is the one judge's (`lost`, `pending`).
            _ => {}
        }
    }
    for p in live.values() {
        // A post the editor pulled back that raced a write is published,
        // and so is one the editor may have left published: only posts of
        // slotgate's kinds count.
        let ours = w.ready.contains(&p.id) || is_news(p);
        if ours && !accounted.contains(&p.id) {
            bad(
                Class::Phantom,
                None,
                format!(
                    "post {} ({:?}) is published and no slot records it",
                    p.id, p.title
                ),
            );
        }
    }
    v.lost += lost_effects;
    let mut outcomes: BTreeMap<(String, String), usize> = BTreeMap::new();
    for row in &w.rows {
        let what = match &row.reason {
            Some(reason) => format!("{} ({reason})", row.state),
            None => row.state.clone(),
        };
        *outcomes.entry((row.kind.clone(), what)).or_default() += 1;
    }
    Tally {
        raced,
        published_in_place: ready_published,
        created,
        staged_copies,
        staged_trashed,
        unmarked,
        outcomes,
        saves_to_publish: w.transitions.iter().filter(|t| saved_publish(t)).count(),
        reads: w.transitions.iter().filter(|t| t.op == WpOp::Read).count(),
        held_writes: w.held_writes,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::scenario::wordpress::{ARTICLE, ARTICLE_CAP, NEWS_CAP, NEWS_SLOTS};

    /// A line of WordPress's log.
    pub(crate) fn t(id: i64, op: WpOp, from: &str, to: &str, at: i64) -> WpTransition {
        WpTransition {
            id,
            op,
            from: from.into(),
            to: to.into(),
            at,
        }
    }

    /// A row of the posts table.
    pub(crate) fn post(id: i64, status: &str, title: &str) -> WpPost {
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

    /// A history where ready posts 1..=7 are published once each, posts
    /// 8..=10 are pulled back and never published: no violation. Each test
    /// below breaks one rule of it.
    fn clean() -> Witness {
        let mut w = Witness {
            ready: (1..=10).collect(),
            withdrawn: vec![8, 9, 10],
            caps: (ARTICLE_CAP, NEWS_CAP),
            ..Witness::default()
        };
        for id in 1..=7 {
            w.transitions
                .push(t(id, WpOp::Read, "pending", "pending", id * 10));
            w.transitions
                .push(t(id, WpOp::Save, "pending", "publish", id * 10 + 1));
            w.posts.push(post(id, "publish", "x"));
            w.rows.push(row(
                &format!("a:{id}"),
                "published",
                Some(&format!("http://wp/p{id}/")),
            ));
        }
        for id in 8..=10 {
            w.transitions
                .push(t(id, WpOp::Save, "pending", "draft", 100 + id));
            w.posts.push(post(id, "draft", "x"));
        }
        w
    }

    fn judged(w: &Witness) -> (Verdict, Tally) {
        let mut v = Verdict::default();
        let tally = judge(w, true, &mut v);
        (v, tally)
    }

    #[test]
    fn a_clean_history_passes() {
        let (v, tally) = judged(&clean());
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(tally.published_in_place, 7);
    }

    #[test]
    fn a_second_save_as_publish_is_doubled() {
        let mut w = clean();
        w.transitions
            .push(t(3, WpOp::Save, "publish", "publish", 500));
        let (v, _) = judged(&w);
        assert_eq!(v.count(Class::Doubled), 1, "{:?}", v.violations);
    }

    #[test]
    fn a_post_never_ready_that_was_published_is_not_ready_published() {
        let mut w = clean();
        w.not_ready.push(20);
        w.transitions
            .push(t(20, WpOp::Save, "draft", "publish", 900));
        let (v, _) = judged(&w);
        assert_eq!(v.count(Class::NotReadyPublished), 1, "{:?}", v.violations);
    }

    #[test]
    fn a_failed_slot_is_failed() {
        let mut w = clean();
        w.rows.push(SlotRow {
            reason: Some("cms_error".into()),
            ..row("a:11", "failed", None)
        });
        let (v, _) = judged(&w);
        assert_eq!(v.count(Class::Failed), 1, "{:?}", v.violations);
    }

    #[test]
    fn a_publish_after_a_pull_back_is_a_violation_unless_it_raced_a_read() {
        let mut w = clean();
        // Read after the pull-back, then written: the worker saw `draft`.
        w.transitions.push(t(8, WpOp::Read, "draft", "draft", 200));
        w.transitions
            .push(t(8, WpOp::Save, "draft", "publish", 201));
        let (v, _) = judged(&w);
        assert_eq!(v.count(Class::WithdrawnPublished), 1, "{:?}", v.violations);
        // Read before the pull-back, written after: the documented race.
        let mut w = clean();
        let i = w.transitions.iter().position(|x| x.id == 9).unwrap();
        w.transitions
            .insert(i, t(9, WpOp::Read, "pending", "pending", 50));
        w.transitions
            .push(t(9, WpOp::Save, "draft", "publish", 300));
        let (v, tally) = judged(&w);
        assert_eq!(v.count(Class::WithdrawnPublished), 0, "{:?}", v.violations);
        assert_eq!(tally.raced, vec![9]);
    }

    #[test]
    fn too_few_publishes_are_lost_and_unrecorded_ones_phantom() {
        let mut w = clean();
        w.transitions.retain(|x| x.id != 7);
        w.rows.pop();
        w.posts[6].status = "pending".into();
        let (v, _) = judged(&w);
        assert_eq!(v.count(Class::Lost), 1, "{:?}", v.violations);
        let mut w = clean();
        w.rows.pop();
        let (v, _) = judged(&w);
        assert_eq!(v.count(Class::Phantom), 1, "{:?}", v.violations);
        let mut w = clean();
        w.rows[0].url = Some("http://wp/elsewhere/".into());
        let (v, _) = judged(&w);
        assert!(v.count(Class::Phantom) >= 1, "{:?}", v.violations);
    }

    /// The clean case plus the creating kind: drafts `n0`..`n5`, each
    /// staged (`new -> draft`) and published by a status change under its
    /// slot's marker `m<i>`, and recorded by its slot.
    fn with_news() -> Witness {
        let mut w = clean();
        w.news_titles = (0..NEWS_CAP).map(|i| format!("n{i}")).collect();
        w.news_markers = (0..NEWS_SLOTS)
            .map(|i| (format!("wp-news:d:{i}"), format!("wp-news-d-{i}-0a1b2c3d")))
            .collect();
        for i in 0..NEWS_CAP {
            let id = 100 + i as i64;
            let (slot, slug) = w.news_markers[i].clone();
            let title = w.news_titles[i].clone();
            w.transitions
                .push(t(id, WpOp::Save, "new", "draft", 1000 + id));
            w.transitions
                .push(t(id, WpOp::Save, "draft", "publish", 1001 + id));
            w.posts.push(news_post(id, "publish", &title, &slug));
            w.rows
                .push(row(&slot, "published", Some(&format!("http://wp/{slug}/"))));
        }
        w
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
        let mut w = with_news();
        let (v, tally) = judged(&w);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!((tally.created, tally.staged_copies), (NEWS_CAP, 0));
        assert!(tally.unmarked.is_empty(), "{:?}", tally.unmarked);
        // A create queued past the timeout, saved after the slot's post was
        // published: a draft with the marker, never published.
        let m0 = w.news_markers[0].1.clone();
        w.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        w.posts.push(news_post(300, "draft", "n0", &m0));
        // A repeated create resolved away: staged, then trashed.
        w.transitions.push(t(301, WpOp::Save, "new", "draft", 3001));
        w.transitions
            .push(t(301, WpOp::Save, "draft", "trash", 3002));
        let trashed = format!("{}__trashed", w.news_markers[1].1);
        w.posts.push(news_post(301, "trash", "n1", &trashed));
        let (v, tally) = judged(&w);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(tally.created, NEWS_CAP);
        assert_eq!((tally.staged_copies, tally.staged_trashed), (2, 1));
    }

    #[test]
    fn two_posts_that_went_out_for_one_draft_are_created_twice() {
        let mut w = with_news();
        // A second copy of n0 published (WordPress gave it `-2`).
        w.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        w.transitions
            .push(t(300, WpOp::Save, "draft", "publish", 3001));
        let slug = format!("{}-2", w.news_markers[0].1);
        w.posts.push(news_post(300, "publish", "n0", &slug));
        let (v, _) = judged(&w);
        // One violation for the pair, though both the draft and the slot
        // name it.
        assert_eq!(v.count(Class::CreatedTwice), 1, "{:?}", v.violations);
        // Published and then trashed: it went out all the same.
        let mut w = with_news();
        w.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        w.transitions
            .push(t(300, WpOp::Save, "draft", "publish", 3001));
        w.transitions
            .push(t(300, WpOp::Save, "publish", "trash", 3002));
        let slug = format!("{}__trashed", w.news_markers[0].1);
        w.posts.push(news_post(300, "trash", "n0", &slug));
        let (v, tally) = judged(&w);
        assert_eq!(v.count(Class::CreatedTwice), 1, "{:?}", v.violations);
        assert_eq!(tally.staged_copies, 0);
    }

    #[test]
    fn two_posts_that_went_out_for_one_slot_are_created_twice() {
        let mut w = with_news();
        // Another draft published under slot 0's marker: each draft went
        // out once, the slot twice.
        w.news_titles.push("n-other".into());
        w.transitions.push(t(300, WpOp::Save, "new", "draft", 3000));
        w.transitions
            .push(t(300, WpOp::Save, "draft", "publish", 3001));
        let slug = format!("{}-2", w.news_markers[0].1);
        w.posts.push(news_post(300, "publish", "n-other", &slug));
        let (v, _) = judged(&w);
        assert_eq!(v.count(Class::CreatedTwice), 1, "{:?}", v.violations);
        let slot0 = &w.news_markers[0].0;
        assert!(
            v.violations
                .iter()
                .any(|x| x.detail.contains(slot0.as_str())),
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
}
