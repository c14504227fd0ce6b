//! `services CMD [ARGS...]` — runs CMD with `DATABASE_URL` and `REDIS_URL`
//! set to servers that answer, starting throwaway ones when needed
//! (`scripts/with-services` builds and runs this; see `testkit::services`).

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cmd: Vec<String> = std::env::args().skip(1).collect();
    if cmd.is_empty() {
        eprintln!("usage: services CMD [ARGS...]");
        return ExitCode::from(2);
    }
    match testkit::services::run(&cmd).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("services: error: {e}");
            ExitCode::from(1)
        }
    }
}
