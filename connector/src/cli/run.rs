//! `run`: the connector in the foreground, with signal handling (SIGINT and
//! SIGTERM drain and stop, SIGUSR1 folds now). The run loop is `pipeline`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::commands;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::pipeline::{run_with, RunOptions};

pub(super) async fn run(path: &Path, exit_at_end: bool, http: Option<SocketAddr>) -> Result<()> {
    let config = Config::load(path)?;
    super::print::check(&commands::check(&config).await?);
    let shutdown = CancellationToken::new();
    let fold_now = Arc::new(tokio::sync::Notify::new());
    spawn_signal_handlers(shutdown.clone(), fold_now.clone())?;
    let listen = http.or(config.http.listen);
    let metrics = Arc::new(Metrics::new(config.http.stall_bound));
    let stop_http = CancellationToken::new();
    if let Some(addr) = listen {
        crate::http::serve(addr, metrics.clone(), stop_http.clone()).await?;
    }
    let linger = config.http.linger;
    let options = RunOptions {
        exit_at_end,
        fold_now: Some(fold_now),
        published: None,
        metrics: listen.map(|_| metrics),
        kafka_statistics: listen.is_some(),
    };
    let result = run_with(config, options, shutdown.clone()).await;
    if let (Err(e), Some(_)) = (&result, listen) {
        // Probes and scrapers see the failure (`/ready` false, e.g. fenced)
        // before the process goes; a signal ends the wait.
        tracing::info!(error = %e, ?linger, "run failed; serving /ready (false) and /metrics before exiting");
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(linger) => {}
        }
    }
    stop_http.cancel();
    let summary = result?;
    println!(
        "stopped after {} records; committed {} partitions",
        summary.records,
        summary.committed.len()
    );
    Ok(())
}

fn spawn_signal_handlers(
    shutdown: CancellationToken,
    fold_now: Arc<tokio::sync::Notify>,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let sig = |k| signal(k).map_err(|e| Error::Bug(format!("signal handler: {e}")));
    let mut term = sig(SignalKind::terminate())?;
    let mut int = sig(SignalKind::interrupt())?;
    let mut usr1 = sig(SignalKind::user_defined1())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = usr1.recv() => { fold_now.notify_one(); continue; }
            }
        }
        tracing::info!("shutdown requested: draining");
        shutdown.cancel();
    });
    Ok(())
}
