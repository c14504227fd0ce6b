//! Signals end the process here, never in the library: the library reports
//! the second SIGTERM/SIGINT (`slotgate::worker::stop_on_signals`) and the
//! binaries exit at once with status 130, leaving unfinished deliveries
//! pending for another worker. The worker and the planner's long-running
//! commands share it.

use tokio_util::sync::CancellationToken;

/// Exit status after a second signal (128 + SIGINT, as shells report it).
pub const SECOND_SIGNAL_EXIT: i32 = 130;

/// The first SIGTERM/SIGINT cancels `cancel` (a graceful stop); a second one
/// exits the process at once.
pub fn on_signals(cancel: CancellationToken) {
    let again = slotgate::worker::stop_on_signals(cancel);
    tokio::spawn(async move {
        again.cancelled().await;
        std::process::exit(SECOND_SIGNAL_EXIT);
    });
}
