//! Exit statuses (DESIGN.md section 4.12): the error types that mean "your
//! input is wrong" (status 2) and the status of `trigger --wait`.

use slotgate::outcome::SlotState;
use slotgate::watch::Watched;
use std::process::ExitCode;

/// Exit status 2: bad configuration (DESIGN).
#[derive(Debug)]
pub struct BadConfig(pub slotgate::config::ConfigError);
impl std::fmt::Display for BadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
impl std::error::Error for BadConfig {}

/// Exit status 2: input that names nothing (a Job name without a slot).
#[derive(Debug)]
pub struct BadInput(pub String);
impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for BadInput {}

/// `trigger --wait`: 0 when the slot published or was skipped, 1 when it
/// (or the delivery) failed, 3 when no outcome is known yet.
pub fn wait_exit_code(w: &Watched) -> u8 {
    match w {
        Watched::Settled { slot, .. } => match slot.state() {
            SlotState::Published | SlotState::Skipped => 0,
            SlotState::Failed => 1,
            // Not reached: a settled slot's state is a final one.
            SlotState::Claimed | SlotState::Publishing => 3,
        },
        Watched::DeliveryFailed { .. } => 1,
        Watched::TimedOut { .. } | Watched::Cancelled => 3,
    }
}

/// The exit status of a failed command: 2 for bad configuration, bad input,
/// a slot that is not due yet and a `dead replay` refused without `--force`
/// (DESIGN.md section 4.12), else 1.
pub fn failure_code(e: &anyhow::Error) -> ExitCode {
    let not_due = matches!(
        e.downcast_ref::<slotgate::plan::PlanError>(),
        Some(slotgate::plan::PlanError::NotDue { .. })
    );
    let refused_replay = e
        .downcast_ref::<slotgate::operator::OperatorError>()
        .is_some_and(|o| o.is_replay_refusal());
    if not_due
        || refused_replay
        || e.downcast_ref::<BadConfig>().is_some()
        || e.downcast_ref::<BadInput>().is_some()
    {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}
