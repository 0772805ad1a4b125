//! A full disk: the graph root on a small tmpfs filled by a ballast file.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::check::Res;
use crate::cluster::Broker;
use crate::report::PhaseReport;
use crate::stage::{Env, Stage, SESSION};

/// The graph root on a small tmpfs, filled to the brim by a ballast file
/// while graphsink runs; then the ballast goes and everything must land.
pub(super) async fn disk(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let mnt = env.work.join("disk-tmpfs");
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "chaos-disk"])
        .arg(&mnt)
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            r.not_run = Some(format!(
                "cannot mount a size-limited tmpfs here (needs root or CAP_SYS_ADMIN): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            return Ok(());
        }
        Err(e) => {
            r.not_run = Some(format!("cannot run mount: {e}"));
            return Ok(());
        }
    }
    let result = disk_phase(env, seed, &mnt, r).await;
    let unmounted = std::process::Command::new("umount").arg(&mnt).status();
    if !unmounted.is_ok_and(|s| s.success()) {
        let lazy = std::process::Command::new("umount")
            .arg("-l")
            .arg(&mnt)
            .status();
        if !lazy.is_ok_and(|s| s.success()) {
            r.errors
                .push(format!("could not unmount the tmpfs at {}", mnt.display()));
        }
    }
    result
}

/// The phase itself, on the tmpfs mounted at `mnt`.
async fn disk_phase(env: &Env, seed: u64, mnt: &Path, r: &mut PhaseReport) -> Res<()> {
    let mut main = Broker::memory(&env.backend, env.work.join("broker-disk.log"))?;
    let dlq = Broker::memory(&env.backend, env.work.join("broker-disk-dead-letters.log"))?;
    let mut st = Stage::new(env, "disk", seed, &main, &dlq, Some(mnt.join("graph"))).await?;
    let mut p = st.spawn(env, None)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Leave 64 KiB free: WAL entries, flushes and folds soon hit ENOSPC.
    let ballast = mnt.join("ballast");
    let free = free_bytes(mnt)?;
    let fill = free.saturating_sub(64 << 10);
    // graphsink writes meanwhile: a ballast cut short by ENOSPC is a full disk too.
    if let Err(e) = std::fs::write(&ballast, vec![0u8; fill as usize]) {
        if e.raw_os_error() != Some(libc::ENOSPC) {
            return Err(format!("ballast: {e}"));
        }
    }
    println!("   disk full: {} KiB left", free_bytes(mnt)? / 1024);
    let full_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < full_until {
        if let Some(e) = p.wait_for(Duration::from_secs(1)).await {
            r.own_exits.push(format!("disk full: {e:?}: {}", p.tail(1)));
            tokio::time::sleep(SESSION).await;
            p = st.spawn(env, None)?;
        }
    }
    std::fs::remove_file(&ballast).map_err(|e| e.to_string())?;
    println!("   disk freed: {} KiB left", free_bytes(mnt)? / 1024);
    let recover = Instant::now() + Duration::from_secs(15);
    while Instant::now() < recover {
        if let Some(e) = p.wait_for(Duration::from_secs(1)).await {
            r.own_exits
                .push(format!("after freeing: {e:?}: {}", p.tail(1)));
            tokio::time::sleep(SESSION).await;
            p = st.spawn(env, None)?;
        }
    }
    st.stop_and_finish(p, env, Some(&mut main), r).await
}

/// Bytes free at `p` for an unprivileged writer.
fn free_bytes(p: &Path) -> Res<u64> {
    let c = std::ffi::CString::new(p.display().to_string()).map_err(|e| e.to_string())?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed out-struct of the right type.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!(
            "statvfs {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}
