//! The vocabulary the run and the judge share: the fault kinds
//! ([`Fault`]), what a fault did ([`FaultRecord`]), which deliveries the
//! harness added and what must become of them ([`Delivery`], [`Expect`]),
//! what a broken rule is ([`Violation`] of a [`Class`]), and the plan the
//! planner printed ([`PlanSlot`]), and how a run ended ([`Outcome`]). It lives apart from all of them so that
//! the scenario (which schedules faults), the topologies (which say which
//! faults they can take), the run (which records) and the judges (which
//! read the records) each depend on it and not on each other.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::collections::HashSet;
use std::time::Instant;

/// Every kind of fault the harness injects; one row of the summary table each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    ConcurrentDup,
    SerialDup,
    TriggerDup,
    BackfillDup,
    XaddDup,
    Kill9,
    Kill9MidWebhook,
    LeaderStop,
    RedisWipe,
    PgTerminate,
    Webhook503,
    WebhookTimeout,
    WebhookSlow,
    WebhookReset,
    Malformed,
    PoisonEntry,
    QuotaHeld,
    Redirect,
    FutureDelivery,
    ClockAhead,
    CmsLate,
    OversizeEntry,
    StallBurst,
    ScheduleEdit,
    RedisMasterFailover,
    SentinelFailover,
    PgFailover,
    /// `--cms probe` only: a publish the CMS records on receipt and
    /// applies only after a delay longer than the HTTP timeout (probed
    /// `409` meanwhile), once with a takeover while it is held.
    WebhookHeldBeforeApply,
    /// `--cms wordpress` only (see `run/wordpress.rs`): a REST write
    /// held after WordPress saved it, past the worker's timeout.
    WpAppliedLost,
    /// `--cms wordpress` only: the same, then every worker killed.
    WpKillMidWrite,
    /// `--cms wordpress` only: REST creates held before their save.
    WpHeldBeforeSave,
    /// `--cms wordpress` only: an editor pulls a ready post back to draft,
    EditorDraft,
    /// ... to the trash,
    EditorTrash,
    /// ... or deletes it.
    EditorDelete,
}

impl Fault {
    pub const ALL: [Fault; 34] = [
        Fault::ConcurrentDup,
        Fault::SerialDup,
        Fault::TriggerDup,
        Fault::BackfillDup,
        Fault::XaddDup,
        Fault::Kill9,
        Fault::Kill9MidWebhook,
        Fault::LeaderStop,
        Fault::RedisWipe,
        Fault::PgTerminate,
        Fault::Webhook503,
        Fault::WebhookTimeout,
        Fault::WebhookSlow,
        Fault::WebhookReset,
        Fault::Malformed,
        Fault::PoisonEntry,
        Fault::QuotaHeld,
        Fault::Redirect,
        Fault::FutureDelivery,
        Fault::ClockAhead,
        Fault::CmsLate,
        Fault::OversizeEntry,
        Fault::StallBurst,
        Fault::ScheduleEdit,
        Fault::RedisMasterFailover,
        Fault::SentinelFailover,
        Fault::PgFailover,
        Fault::WebhookHeldBeforeApply,
        Fault::WpAppliedLost,
        Fault::WpKillMidWrite,
        Fault::WpHeldBeforeSave,
        Fault::EditorDraft,
        Fault::EditorTrash,
        Fault::EditorDelete,
    ];

    /// Faults only a `probe_url` CMS can take (`--cms probe`): they are
    /// in no other scenario's default set.
    pub fn needs_probe_cms(self) -> bool {
        self == Fault::WebhookHeldBeforeApply
    }

    /// Faults only the WordPress scenario injects (`--cms wordpress`).
    pub fn needs_wordpress(self) -> bool {
        matches!(
            self,
            Fault::WpAppliedLost
                | Fault::WpKillMidWrite
                | Fault::WpHeldBeforeSave
                | Fault::EditorDraft
                | Fault::EditorTrash
                | Fault::EditorDelete
        )
    }

    /// The webhook faults the CMS injects at random, per call.
    pub fn is_random_webhook(self) -> bool {
        matches!(
            self,
            Fault::Webhook503 | Fault::WebhookTimeout | Fault::WebhookSlow | Fault::WebhookReset
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::ConcurrentDup => "concurrent-dup",
            Fault::SerialDup => "serial-dup",
            Fault::TriggerDup => "trigger-dup",
            Fault::BackfillDup => "backfill-dup",
            Fault::XaddDup => "redis-cli-xadd-dup",
            Fault::Kill9 => "kill-9",
            Fault::Kill9MidWebhook => "kill-9-mid-webhook",
            Fault::LeaderStop => "leader-sigstop",
            Fault::RedisWipe => "redis-prefix-wipe",
            Fault::PgTerminate => "pg-terminate",
            Fault::Webhook503 => "webhook-503",
            Fault::WebhookTimeout => "webhook-timeout",
            Fault::WebhookSlow => "webhook-slow",
            Fault::WebhookReset => "webhook-reset",
            Fault::Malformed => "malformed",
            Fault::PoisonEntry => "poison-entry",
            Fault::QuotaHeld => "quota-held",
            Fault::Redirect => "redirect",
            Fault::FutureDelivery => "future-delivery",
            Fault::ClockAhead => "clock-ahead",
            Fault::CmsLate => "cms-late",
            Fault::OversizeEntry => "oversize-entry",
            Fault::StallBurst => "stall-burst",
            Fault::ScheduleEdit => "schedule-edit",
            Fault::RedisMasterFailover => "redis-master-failover",
            Fault::SentinelFailover => "sentinel-failover",
            Fault::PgFailover => "pg-failover",
            Fault::WebhookHeldBeforeApply => "webhook-held-before-apply",
            Fault::WpAppliedLost => "wp-applied-lost",
            Fault::WpKillMidWrite => "wp-kill-mid-write",
            Fault::WpHeldBeforeSave => "wp-held-before-save",
            Fault::EditorDraft => "editor-draft",
            Fault::EditorTrash => "editor-trash",
            Fault::EditorDelete => "editor-delete",
        }
    }

    /// The `caller` field of deliveries this fault injects with XADD.
    pub fn caller(self) -> &'static str {
        match self {
            Fault::ConcurrentDup => "chaos-concurrent",
            Fault::SerialDup => "chaos-serial",
            Fault::XaddDup => "chaos-xadd",
            Fault::TriggerDup => "manual",
            Fault::BackfillDup => "backfill",
            Fault::Malformed => "chaos-malformed",
            Fault::PoisonEntry => "chaos-poison",
            Fault::FutureDelivery => "chaos-future",
            Fault::OversizeEntry => "chaos-oversize",
            Fault::StallBurst => "chaos-stall-burst",
            _ => "",
        }
    }
}

/// What went wrong, one class per rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// A due effect that never happened.
    Lost,
    /// A draft published under two keys, or one key carrying two drafts.
    Doubled,
    /// A second applied call under one key that no injected fault explains.
    Replayed,
    /// slotgate recorded a webhook slot published; the CMS never applied it.
    Phantom,
    /// A slot recorded failed whose call the CMS applied and answered in time.
    FailedWithEffect,
    /// An effect more than 1 s before its slot was due.
    Early,
    /// slotgate's draft for a slot differs from the draft the CMS received.
    Mismatch,
    /// A skip reason the facts contradict.
    WrongReason,
    /// An effect nobody planned, of the wrong kind, over the cap, or for a
    /// slot recorded skipped; a call to an unknown path.
    Unexpected,
    /// Record-only judge: a draft bound to two slots, or a slot rebound.
    DraftBoundTwice,
    /// Record-only judge: a committed gate row was deleted.
    GateDeleted,
    /// Record-only judge: the daily quota disagrees with the outcomes.
    Quota,
    /// A planned slot without exactly one outcome matching its gate row.
    Outcome,
    /// An injected delivery not handled as it must be (a duplicate of a
    /// finished slot not `slot_taken`, one never handled, a wrong reason).
    Delivery,
    /// Work left in Redis, open claims, drafts left `publishing`.
    Pending,
    /// A dead letter nothing explains, or a missing one.
    DeadLetter,
    /// The run did not settle by its deadline.
    Unsettled,
    /// A worker exited by itself (or not cleanly on SIGTERM).
    WorkerExit,
    /// `--cms probe`: the CMS (which does not dedupe) applied a publish
    /// under one idempotency key more than once, whatever explains it.
    AppliedTwice,
    /// `--cms wordpress`: two posts went out for one draft or one slot.
    CreatedTwice,
    /// `--cms wordpress`: a post published after an editor pulled it back
    /// (outside the one round trip of read-before-write).
    WithdrawnPublished,
    /// `--cms wordpress`: a post that was never ready got published.
    NotReadyPublished,
    /// `--cms wordpress`: a slot of a WordPress kind failed.
    Failed,
}

impl Class {
    /// Every class of the judge ([`crate::judge`]), in its table's order.
    pub const ALL: [Class; 23] = [
        Class::Lost,
        Class::Doubled,
        Class::Replayed,
        Class::Phantom,
        Class::FailedWithEffect,
        Class::Early,
        Class::Mismatch,
        Class::WrongReason,
        Class::Unexpected,
        Class::DraftBoundTwice,
        Class::GateDeleted,
        Class::Quota,
        Class::Outcome,
        Class::Delivery,
        Class::Pending,
        Class::DeadLetter,
        Class::Unsettled,
        Class::WorkerExit,
        Class::AppliedTwice,
        Class::CreatedTwice,
        Class::WithdrawnPublished,
        Class::NotReadyPublished,
        Class::Failed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Lost => "lost",
            Class::Doubled => "doubled",
            Class::Replayed => "replayed",
            Class::Phantom => "phantom",
            Class::FailedWithEffect => "failed_with_effect",
            Class::Early => "early",
            Class::Mismatch => "mismatch",
            Class::WrongReason => "wrong_reason",
            Class::Unexpected => "unexpected",
            Class::DraftBoundTwice => "draft_bound_twice",
            Class::GateDeleted => "gate_deleted",
            Class::Quota => "quota",
            Class::Outcome => "outcome",
            Class::Delivery => "delivery",
            Class::Pending => "pending",
            Class::DeadLetter => "dead_letter",
            Class::Unsettled => "unsettled",
            Class::WorkerExit => "worker_exit",
            Class::AppliedTwice => "applied_twice",
            Class::CreatedTwice => "created_twice",
            Class::WithdrawnPublished => "withdrawn_published",
            Class::NotReadyPublished => "not_ready_published",
            Class::Failed => "failed",
        }
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub class: Class,
    pub slot: Option<String>,
    pub detail: String,
}

impl Violation {
    pub fn new(class: Class, slot: Option<String>, detail: String) -> Violation {
        Violation {
            class,
            slot,
            detail,
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class.name().to_uppercase(), self.detail)
    }
}

/// A scheduled fault and what became of it.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: Fault,
    /// Slots it could have touched.
    pub affected: HashSet<String>,
    /// The harness carried it out.
    pub injected: bool,
    /// ... and saw that it took hold (a SIGKILL exit status, a stopped
    /// process and a new lease epoch, a terminated backend, deleted keys,
    /// added entries, a waiting lock, a clock ahead, a held call).
    pub verified: bool,
}

/// What must become of a delivery the harness added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No rule of its own (copies of a slot that may not be done yet).
    Any,
    /// A duplicate of a finished slot: `skipped/slot_taken`.
    Taken,
    /// Dead-lettered with this reason.
    Dead(&'static str),
    /// A delivery for a day that has not come: `skipped/not_due`.
    NotDue,
    /// Not judged by itself (an entry a stream repair may drop); the rest
    /// of the run shows whether the fleet survived it.
    Unjudged,
}

/// A delivery the harness added.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub fault: Fault,
    /// Stream entry id, when known (`backfill` does not print them).
    pub entry: Option<String>,
    pub slot: Option<String>,
    pub at: Instant,
    pub expect: Expect,
}

/// One planned slot, as `planner plan --json` printed it.
#[derive(Debug, Clone, Deserialize)]
pub struct PlanSlot {
    pub slot: String,
    pub kind: String,
    pub due_at: DateTime<Utc>,
}

/// How a run ended.
pub(crate) enum Outcome {
    /// Every fault verified, no violation.
    Pass,
    /// Every fault verified, at least one violation.
    Fail,
    /// A scheduled fault could not be injected and verified: the run
    /// proves nothing either way.
    NotInjected,
}

impl Outcome {
    /// From whether every scheduled fault was injected and verified, and
    /// whether no rule broke.
    pub(crate) fn of(injected: bool, pass: bool) -> Outcome {
        match (injected, pass) {
            (false, _) => Outcome::NotInjected,
            (true, true) => Outcome::Pass,
            (true, false) => Outcome::Fail,
        }
    }

    /// Prints the run's last line, the one CI and people grep for:
    /// `chaos: PASS seed=N class=count… violations=N`.
    pub(crate) fn print_line(&self, seed: u64, counts: &[(&str, usize)], violations: usize) {
        let counts: Vec<String> = counts.iter().map(|(c, n)| format!("{c}={n}")).collect();
        println!(
            "\nchaos: {} seed={seed} {} violations={violations}",
            match self {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::NotInjected => "COULD NOT INJECT",
            },
            counts.join(" "),
        );
    }
}
