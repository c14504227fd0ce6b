//! `slot_number`: which number each configured local time of a kind
//! carries, kept across schedule edits (DESIGN 4.18).
//!
//! A slot's key is `<kind>:<day>:<number>`, and the key is the idempotency
//! key of everything the slot does. If the number were the time's position
//! in the `slots` list, inserting a time in front would hand today's
//! already-run slot's number to another time (which would then be refused
//! as a duplicate) and give the old time a fresh number (so it would run a
//! second time). Here a time keeps the number it was first given; a new
//! time takes the kind's highest number + 1, so numbers are identities and
//! not an order.

use super::StoreError;
use crate::config::KindConfig;
use chrono::NaiveTime;
use sqlx::postgres::PgPool;
use sqlx::Row;
use std::collections::{HashMap, HashSet};

/// A configured time as the table keys it: the local time and which
/// listing of that time it is (1 for the first "09:00" of the list, 2 for
/// a second one).
pub type Listing = (NaiveTime, u32);

/// The listings of `times` in list order.
pub fn listings(times: &[NaiveTime]) -> Vec<Listing> {
    let mut seen: HashMap<NaiveTime, u32> = HashMap::new();
    times
        .iter()
        .map(|t| {
            let n = seen.entry(*t).or_insert(0);
            *n += 1;
            (*t, *n)
        })
        .collect()
}

/// One kind's numbering after [`number_slots`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Numbering {
    /// The number of each configured time, in the config's order.
    pub active: Vec<u32>,
    /// Numbers given to times that are no longer configured, ascending.
    pub retired: Vec<(u32, NaiveTime)>,
    /// The listings this call numbers (first seen), with their numbers.
    pub added: Vec<(Listing, u32)>,
}

/// Replaces each kind's parsed slot numbers (positions) with those kept
/// in Postgres, numbering new times (DESIGN 4.18). Every process that
/// plans or runs slots calls this once, before it does either.
pub async fn number_kinds(pool: &PgPool, kinds: &mut [KindConfig]) -> Result<(), StoreError> {
    let lists: Vec<(&str, &[NaiveTime])> = kinds
        .iter()
        .map(|k| (k.name.as_str(), k.slots.as_slice()))
        .collect();
    let mut numbered = number_slots(pool, &lists).await?;
    for k in kinds {
        let n = numbered.remove(&k.name).expect("every kind is numbered");
        if !n.added.is_empty() && n.added.len() < k.slots.len() {
            tracing::info!(kind = %k.name, added = n.added.len(), numbers = ?n.active, "new slot times numbered; the others keep their numbers");
        }
        k.slot_numbers = n.active;
        k.retired_slots = n.retired;
    }
    Ok(())
}

/// Numbers the configured times of each kind (`(kind, slots)` in config
/// order): existing listings keep their number, new ones take the kind's
/// highest + 1 in list order, and a kind seen for the first time takes the
/// list's positions (so keys planned before numbering existed stay
/// valid). Returns each kind's [`Numbering`].
///
/// Concurrent callers (replicas starting together, a planner and a worker)
/// agree: the first read takes no lock and returns when every listing is
/// numbered already (every start but the first after an edit); otherwise
/// the table is locked against writers (`EXCLUSIVE`: plain reads go on),
/// read again and extended in one transaction.
pub async fn number_slots(
    pool: &PgPool,
    kinds: &[(&str, &[NaiveTime])],
) -> Result<HashMap<String, Numbering>, StoreError> {
    let names: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
    let stored = read_numbers(pool, &names).await?;
    if let Some(done) = resolve(kinds, &stored, false) {
        return Ok(done);
    }
    let mut tx = pool.begin().await?;
    sqlx::query("LOCK TABLE slot_number IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let stored = read_numbers(&mut *tx, &names).await?;
    let out = numbering_of(kinds, &stored);
    let (mut ks, mut ts, mut os, mut ns) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (kind, n) in &out {
        for ((t, occ), no) in &n.added {
            ks.push(kind.as_str());
            ts.push(*t);
            os.push(*occ as i32);
            ns.push(*no as i32);
        }
    }
    sqlx::query(
        "INSERT INTO slot_number (kind, local_time, occurrence, slot)
         SELECT * FROM UNNEST($1::text[], $2::time[], $3::int[], $4::int[])",
    )
    .bind(&ks)
    .bind(&ts)
    .bind(&os)
    .bind(&ns)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(out)
}

/// Stored numbers: kind → listing → number.
pub type Stored = HashMap<String, HashMap<Listing, u32>>;

/// What [`number_slots`] would make of `kinds` given `stored`, without
/// writing (`planner audit --with-history` reads the retired numbers).
pub fn numbering_of(kinds: &[(&str, &[NaiveTime])], stored: &Stored) -> HashMap<String, Numbering> {
    resolve(kinds, stored, true).expect("extending always resolves")
}

/// The numbers stored for `kinds`, read only (`planner audit
/// --with-history` compares a config against them without numbering it).
pub async fn stored_numbers(pool: &PgPool, kinds: &[&str]) -> Result<Stored, StoreError> {
    read_numbers(pool, kinds).await
}

async fn read_numbers<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    kinds: &[&str],
) -> Result<Stored, StoreError> {
    let rows = sqlx::query(
        "SELECT kind, local_time, occurrence, slot FROM slot_number WHERE kind = ANY($1)",
    )
    .bind(kinds)
    .fetch_all(exec)
    .await?;
    let mut out: Stored = HashMap::new();
    for r in rows {
        let occ: i32 = r.try_get(2)?;
        let no: i32 = r.try_get(3)?;
        out.entry(r.try_get(0)?)
            .or_default()
            .insert((r.try_get(1)?, occ as u32), no as u32);
    }
    Ok(out)
}

/// The numbering of `kinds` given the stored rows; `None` when a listing
/// has no number and `extend` is false (the caller then takes the lock).
fn resolve(
    kinds: &[(&str, &[NaiveTime])],
    stored: &Stored,
    extend: bool,
) -> Option<HashMap<String, Numbering>> {
    let empty = HashMap::new();
    let mut out = HashMap::new();
    for (kind, times) in kinds {
        let have = stored.get(*kind).unwrap_or(&empty);
        let listed = listings(times);
        // A set beside the list: the retired check below asks it once per
        // stored listing, and a list is as long as a kind's day (linear
        // scans made a day of 10,000 times cost 10^8 comparisons per kind
        // at every worker start and every `planner plan`).
        let listed_set: HashSet<&Listing> = listed.iter().collect();
        let mut next = have.values().copied().max().unwrap_or(0);
        let mut n = Numbering::default();
        for (pos, l) in listed.iter().enumerate() {
            let no = match have.get(l) {
                Some(no) => *no,
                None if !extend => return None,
                // A kind's first numbering keeps the positions.
                None if have.is_empty() => pos as u32 + 1,
                None => {
                    next += 1;
                    next
                }
            };
            if !have.contains_key(l) {
                n.added.push((*l, no));
            }
            n.active.push(no);
        }
        let mut retired: Vec<(u32, NaiveTime)> = have
            .iter()
            .filter(|(l, _)| !listed_set.contains(l))
            .map(|((t, _), no)| (*no, *t))
            .collect();
        retired.sort();
        n.retired = retired;
        out.insert((*kind).to_owned(), n);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> NaiveTime {
        NaiveTime::parse_from_str(s, "%H:%M").unwrap()
    }

    #[test]
    fn a_time_listed_twice_is_two_listings() {
        let l = listings(&[t("09:00"), t("12:00"), t("09:00")]);
        assert_eq!(l, vec![(t("09:00"), 1), (t("12:00"), 1), (t("09:00"), 2)]);
    }

    #[test]
    fn first_numbering_keeps_positions_and_edits_keep_numbers() {
        let first = [t("12:00"), t("18:00")];
        let n = resolve(&[("a", &first)], &HashMap::new(), true).unwrap();
        assert_eq!(n["a"].active, vec![1, 2]);
        let stored: Stored = HashMap::from([(
            "a".to_owned(),
            HashMap::from([((t("12:00"), 1), 1), ((t("18:00"), 1), 2)]),
        )]);
        // Insert 09:00 in front, drop 18:00.
        let edited = [t("09:00"), t("12:00")];
        assert!(resolve(&[("a", &edited)], &stored, false).is_none());
        let n = resolve(&[("a", &edited)], &stored, true).unwrap();
        assert_eq!(n["a"].active, vec![3, 1]);
        assert_eq!(n["a"].retired, vec![(2, t("18:00"))]);
        assert_eq!(n["a"].added.len(), 1);
    }
}
