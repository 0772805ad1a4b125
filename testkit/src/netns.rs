//! Hosts on a network the test controls: Linux network namespaces joined
//! by a router namespace, and the faults a network makes (a link lost to
//! one host or to all). [`crate::cluster`] puts Kafka's nodes and their
//! clients on it; anything else (an S3 server, a registry) can be a host.
//!
//! ```text
//!   host "node1" 10.77.1.2 ─veth─ 10.77.1.1 ┐
//!   host "node2" 10.77.2.2 ─veth─ 10.77.2.1 ├─ router namespace "hub"
//!   host "m1"   10.77.11.2 ─veth─ 10.77.11.1┘  (forwards; no way out)
//! ```
//!
//! Host k is `10.77.k.2`, linked by a veth pair to the router's
//! `10.77.k.1`, its only route (`10.77.0.0/16`). Nothing is added to the
//! machine's own namespace, so every network is private to its test and
//! two tests may use the same addresses at once. A cut is a policy rule in
//! the router (`ip rule … blackhole`): the router drops the packets of
//! both directions, silently (as a lost link: connections stall, connects
//! time out) or with an ICMP error ([`Cut::Unreachable`]: connects fail at
//! once). Each host keeps its own loopback and whatever listens there.
//!
//! Namespaces are named `gsk<PID>x<N>-<label>`; the [`Network`] and each
//! [`Host`] delete theirs on drop, with every process still inside, and
//! [`Network::new`] first deletes those of processes that are gone (a
//! crashed test). It needs root (this machine runs tests as root); without
//! it, or without namespaces, it fails saying why.

use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every namespace this module makes starts with it (and the sweep only
/// deletes such names).
pub const PREFIX: &str = "gsk";

/// The first two octets of every host's address.
pub const NET: [u8; 2] = [10, 77];

/// The highest host index: 10.77.100.x and up are left for addresses a
/// host adds to its own loopback ([`Host::add_local_address`]).
pub const MAX_INDEX: u8 = 99;

/// Rule priority of every cut (below the `main` table's 32766).
const CUT_PREF: &str = "100";

static NEXT_NETWORK: AtomicU32 = AtomicU32::new(0);

/// How a cut drops packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Silently, as a lost link or a dead switch.
    Blackhole,
    /// With ICMP "host unreachable": connects fail at once.
    Unreachable,
}

impl Cut {
    fn word(self) -> &'static str {
        match self {
            Cut::Blackhole => "blackhole",
            Cut::Unreachable => "unreachable",
        }
    }
}

/// Runs `ip ARGS`, returning its standard output or an error with its
/// standard error.
pub(crate) fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run `ip {}`: {e} (iproute2 is needed)", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// The processes in namespace `ns`.
fn pids_in(ns: &str) -> Vec<u32> {
    ip(&["netns", "pids", ns])
        .map(|out| {
            out.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILLs whatever runs in `ns` and deletes it; never fails (a drop and
/// the sweep call it).
fn delete_namespace(ns: &str) {
    for pid in pids_in(ns) {
        // SAFETY: kill(2) with a pid from `ip netns pids`; no memory involved.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    let _ = ip(&["netns", "del", ns]);
}

/// Deletes the namespaces (and kills what runs in them) that a process
/// which is gone left behind: `gsk<PID>x…` with no process PID. Returns
/// their names.
pub fn sweep_stale() -> Vec<String> {
    let Ok(list) = ip(&["netns", "list"]) else {
        return Vec::new();
    };
    let mut swept = Vec::new();
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('x').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !alive(pid) {
            delete_namespace(name);
            swept.push(name.to_owned());
        }
    }
    swept
}

/// Deletes every namespace this process made (`gsk<PID>x…`), killing what
/// runs in them: the teardown of a process that is told to stop (a signal)
/// and cannot unwind to its drops. Returns their names.
pub fn delete_own() -> Vec<String> {
    let Ok(list) = ip(&["netns", "list"]) else {
        return Vec::new();
    };
    let mine = format!("{PREFIX}{}x", std::process::id());
    let mut deleted = Vec::new();
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if name.starts_with(&mine) {
            delete_namespace(name);
            deleted.push(name.to_owned());
        }
    }
    deleted
}

/// A cut in force: packets from `from` to `to` (either `None`: any host)
/// are dropped by the router.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    from: Option<Ipv4Addr>,
    to: Option<Ipv4Addr>,
    how: Cut,
}

impl Rule {
    fn args(&self, hub: &str, verb: &str) -> Vec<String> {
        let mut a: Vec<String> = ["-n", hub, "rule", verb, "pref", CUT_PREF]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if let Some(f) = self.from {
            a.extend(["from".into(), f.to_string()]);
        }
        if let Some(t) = self.to {
            a.extend(["to".into(), t.to_string()]);
        }
        a.push(self.how.word().into());
        a
    }
}

struct Shared {
    prefix: String,
    hub: String,
    used: Mutex<BTreeSet<u8>>,
    rules: Mutex<Vec<Rule>>,
}

impl Shared {
    fn apply(&self, rule: Rule) -> Result<(), String> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        if rules.contains(&rule) {
            return Ok(());
        }
        let args = rule.args(&self.hub, "add");
        ip(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        rules.push(rule);
        Ok(())
    }

    /// Removes the rules `keep` says false to.
    fn remove(&self, mut gone: impl FnMut(&Rule) -> bool) -> Result<(), String> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let mut first_err = None;
        rules.retain(|r| {
            if !gone(r) {
                return true;
            }
            let args = r.args(&self.hub, "del");
            match ip(&args.iter().map(String::as_str).collect::<Vec<_>>()) {
                Ok(_) => false,
                Err(e) => {
                    first_err.get_or_insert(e);
                    true
                }
            }
        });
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        delete_namespace(&self.hub);
    }
}

/// A private network: the router namespace and the hosts added to it.
/// Dropping it (and every [`Host`] of it) deletes them all.
pub struct Network {
    shared: Arc<Shared>,
}

struct HostInner {
    ns: String,
    label: String,
    index: u8,
    net: Arc<Shared>,
}

impl Drop for HostInner {
    fn drop(&mut self) {
        delete_namespace(&self.ns);
        // The kernel tears a deleted namespace down when the last process
        // in it is gone, which may be later: the router's end of the link
        // would outlive it and refuse the next host at this index. Deleting
        // that end deletes the pair now.
        let _ = ip(&[
            "-n",
            &self.net.hub,
            "link",
            "del",
            &format!("h{}", self.index),
        ]);
        let _ = self.net.remove(|r| {
            let me = Some(host_addr(self.index));
            r.from == me || r.to == me
        });
        self.net
            .used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.index);
    }
}

/// One host: a network namespace with one link to the router. Clones share
/// it; the last one dropped kills what still runs in it and deletes it.
#[derive(Clone)]
pub struct Host {
    inner: Arc<HostInner>,
}

/// Host `index`'s address, `10.77.index.2`.
pub fn host_addr(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(NET[0], NET[1], index, 2)
}

fn router_addr(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(NET[0], NET[1], index, 1)
}

impl Network {
    /// A new network: sweeps namespaces left by dead processes, then makes
    /// the router namespace. Fails, saying why, where namespaces cannot be
    /// made (not root, no iproute2, a kernel without them).
    pub fn new() -> Result<Network, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(
                "network namespaces need root (`ip netns add`); run the test as root, \
                        as this project's machines do"
                    .into(),
            );
        }
        for ns in sweep_stale() {
            eprintln!("graphsink-testkit: deleted the stale network namespace {ns}");
        }
        let prefix = format!(
            "{PREFIX}{}x{}",
            std::process::id(),
            NEXT_NETWORK.fetch_add(1, Ordering::Relaxed)
        );
        let hub = format!("{prefix}-hub");
        ip(&["netns", "add", &hub])
            .map_err(|e| format!("cannot make a network namespace, so no test network: {e}"))?;
        // From here on a failure deletes the hub (Shared's drop).
        let shared = Arc::new(Shared {
            prefix,
            hub: hub.clone(),
            used: Mutex::new(BTreeSet::new()),
            rules: Mutex::new(Vec::new()),
        });
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        // The router's own packets (the ICMP errors of an `unreachable`
        // cut) pass every cut: else isolating a host would also drop the
        // error that tells it so.
        ip(&[
            "-n", &hub, "rule", "add", "pref", "99", "iif", "lo", "lookup", "main",
        ])?;
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &hub,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run sysctl in {hub}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot turn on forwarding in the router namespace {hub}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Network { shared })
    }

    /// The router namespace's name.
    pub fn router(&self) -> &str {
        &self.shared.hub
    }

    /// A host at the lowest free index from 11 up (1..=10 are left for
    /// hosts placed by [`Network::add_host_at`], such as Kafka's nodes).
    pub fn add_host(&self, label: &str) -> Result<Host, String> {
        let index = {
            let used = self.shared.used.lock().unwrap_or_else(|e| e.into_inner());
            (11..=MAX_INDEX)
                .find(|i| !used.contains(i))
                .ok_or_else(|| format!("no free host index left for {label}"))?
        };
        self.add_host_at(label, index)
    }

    /// A host named `label` at `10.77.index.2`.
    pub fn add_host_at(&self, label: &str, index: u8) -> Result<Host, String> {
        if index == 0 || index > MAX_INDEX {
            return Err(format!("host index {index} is outside 1..={MAX_INDEX}"));
        }
        if !self
            .shared
            .used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(index)
        {
            return Err(format!("host index {index} is taken"));
        }
        let ns = format!("{}-{label}", self.shared.prefix);
        if let Err(e) = ip(&["netns", "add", &ns]) {
            self.shared
                .used
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&index);
            return Err(e);
        }
        // From here on a failure deletes the namespace (HostInner's drop).
        let host = Host {
            inner: Arc::new(HostInner {
                ns: ns.clone(),
                label: label.to_owned(),
                index,
                net: self.shared.clone(),
            }),
        };
        let hub = &self.shared.hub;
        let veth = format!("h{index}");
        let me = format!("{}/24", host_addr(index));
        let router = format!("{}/24", router_addr(index));
        let net = format!("{}.{}.0.0/16", NET[0], NET[1]);
        let gateway = router_addr(index).to_string();
        ip(&[
            "-n", hub, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["-n", hub, "addr", "add", &router, "dev", &veth])?;
        ip(&["-n", hub, "link", "set", &veth, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&["-n", &ns, "addr", "add", &me, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "route", "add", &net, "via", &gateway])?;
        Ok(host)
    }

    /// Cuts `a` off from `b`, both ways, until [`Network::heal`].
    pub fn cut(&self, a: &Host, b: &Host, how: Cut) -> Result<(), String> {
        let (x, y) = (a.addr(), b.addr());
        self.shared.apply(Rule {
            from: Some(x),
            to: Some(y),
            how,
        })?;
        self.shared.apply(Rule {
            from: Some(y),
            to: Some(x),
            how,
        })
    }

    /// Undoes [`Network::cut`] of `a` and `b`.
    pub fn heal(&self, a: &Host, b: &Host) -> Result<(), String> {
        let (x, y) = (Some(a.addr()), Some(b.addr()));
        self.shared
            .remove(|r| (r.from == x && r.to == y) || (r.from == y && r.to == x))
    }

    /// Cuts `host` off from every other host.
    pub fn isolate(&self, host: &Host, how: Cut) -> Result<(), String> {
        let me = Some(host.addr());
        self.shared.apply(Rule {
            from: me,
            to: None,
            how,
        })?;
        self.shared.apply(Rule {
            from: None,
            to: me,
            how,
        })
    }

    /// Undoes every cut that names `host` (its isolation and its cuts from
    /// single hosts).
    pub fn rejoin(&self, host: &Host) -> Result<(), String> {
        let me = Some(host.addr());
        self.shared.remove(|r| r.from == me || r.to == me)
    }

    /// Undoes every cut.
    pub fn heal_all(&self) -> Result<(), String> {
        self.shared.remove(|_| true)
    }

    /// The cuts in force, as the router lists them (`ip rule`), for a
    /// test's failure message.
    pub fn rules(&self) -> String {
        ip(&["-n", &self.shared.hub, "rule", "show"]).unwrap_or_else(|e| e)
    }
}

impl Host {
    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.inner.ns
    }

    /// The label it was added with.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// Its index on the network.
    pub fn index(&self) -> u8 {
        self.inner.index
    }

    /// Its address, `10.77.<index>.2`.
    pub fn addr(&self) -> Ipv4Addr {
        host_addr(self.inner.index)
    }

    /// `program` to run in this host's namespace: `ip netns exec NS
    /// program`. Add arguments, environment and stdio as to any `Command`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.inner.ns]).arg(program);
        c
    }

    /// Runs `f` on a thread that has entered this host's namespace, and
    /// returns what it returns (a panic in it is resumed here). Sockets
    /// made inside stay in the namespace, and so do threads spawned inside:
    /// a librdkafka client created in `f` keeps all its connections here.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, String> {
        let path = format!("/run/netns/{}", self.inner.ns);
        let file = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
        std::thread::scope(|s| {
            let joined = s
                .spawn(|| {
                    // SAFETY: setns(2) on this new thread only, with a
                    // namespace file descriptor that is open for the call.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(format!(
                            "enter namespace {}: {}",
                            self.inner.ns,
                            io::Error::last_os_error()
                        ));
                    }
                    Ok(f())
                })
                .join();
            match joined {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// A TCP connection made from this host.
    pub fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        self.enter(|| TcpStream::connect_timeout(&addr, timeout))
            .map_err(io::Error::other)?
    }

    /// Adds `addr`/32 to this host's loopback: an address only this host
    /// reaches (where a sidecar such as Toxiproxy listens).
    pub fn add_local_address(&self, addr: Ipv4Addr) -> Result<(), String> {
        ip(&[
            "-n",
            &self.inner.ns,
            "addr",
            "add",
            &format!("{addr}/32"),
            "dev",
            "lo",
        ])
        .map(|_| ())
    }

    /// The processes running in this host's namespace.
    pub fn pids(&self) -> Vec<u32> {
        pids_in(&self.inner.ns)
    }
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Host({} {})", self.inner.label, self.addr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Instant;

    /// A listener on `host` that answers each connection with "hi".
    fn greeter(host: &Host) -> (SocketAddr, std::thread::JoinHandle<()>) {
        let l = host
            .enter(|| TcpListener::bind((host.addr(), 0)))
            .expect("enter")
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            for c in l.incoming().take(16) {
                let Ok(mut c) = c else { return };
                let _ = c.write_all(b"hi");
            }
        });
        (addr, t)
    }

    fn greets(from: &Host, addr: SocketAddr) -> Result<(), String> {
        let mut s = from
            .connect(addr, Duration::from_secs(1))
            .map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// A namespace whose process is gone is deleted by the next network's
    /// sweep, with what still runs in it; a live process's is kept.
    #[test]
    fn stale_namespaces_are_swept() {
        let mut gone = Command::new("true").spawn().expect("spawn");
        let dead = gone.id();
        gone.wait().unwrap();
        let stale = format!("{PREFIX}{dead}x0-hub");
        let live = format!("{PREFIX}{}x999-probe", std::process::id());
        ip(&["netns", "add", &stale]).expect("add");
        ip(&["netns", "add", &live]).expect("add");
        let mut sleeper = Command::new("ip")
            .args(["netns", "exec", &stale, "sleep", "60"])
            .spawn()
            .expect("spawn in the stale namespace");
        let _net = Network::new().expect("network");
        let left = ip(&["netns", "list"]).unwrap();
        let _ = ip(&["netns", "del", &live]);
        assert!(!left.contains(&stale), "{stale} swept: {left}");
        assert!(left.contains(&live), "{live} kept: {left}");
        let status = sleeper.wait().expect("wait");
        assert!(!status.success(), "what ran in it was killed: {status}");
    }

    /// A dropped host's index is free at once, even while its namespace
    /// lingers (a process not yet gone holds it; here an open handle does):
    /// the next host at that index links up.
    #[test]
    fn a_dropped_hosts_index_is_reused_at_once() {
        let net = Network::new().expect("network");
        let a = net.add_host_at("a", 20).expect("host a");
        let held = std::fs::File::open(format!("/run/netns/{}", a.name())).expect("open");
        drop(a);
        let b = net.add_host_at("b", 20).expect("a host at the freed index");
        assert_eq!(b.addr(), host_addr(20));
        drop(held);
    }

    /// Hosts reach each other through the router; a cut stops that both
    /// ways (silently or at once, as asked), heal restores it, and the
    /// namespaces are gone once dropped.
    #[test]
    fn cuts_and_heals() {
        let net = Network::new().expect("network");
        let a = net.add_host("a").expect("host a");
        let b = net.add_host("b").expect("host b");
        let c = net.add_host("c").expect("host c");
        assert_eq!(a.addr(), Ipv4Addr::new(10, 77, 11, 2));
        let (to_b, _tb) = greeter(&b);
        let (to_c, _tc) = greeter(&c);
        greets(&a, to_b).expect("a reaches b");

        net.cut(&a, &b, Cut::Blackhole).expect("cut");
        let t = Instant::now();
        let e = greets(&a, to_b).expect_err("a is cut from b");
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "a silent drop times out: {e}"
        );
        greets(&a, to_c).expect("a still reaches c");
        net.heal(&a, &b).expect("heal");
        greets(&a, to_b).expect("a reaches b again");

        net.isolate(&a, Cut::Unreachable).expect("isolate");
        let t = Instant::now();
        let e = greets(&a, to_c).expect_err("a is cut from everyone");
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "unreachable fails at once: {e}"
        );
        greets(&b, to_c).expect("b still reaches c");
        net.rejoin(&a).expect("rejoin");
        greets(&a, to_c).expect("a reaches c again");

        let names = [a.name().to_owned(), net.router().to_owned()];
        drop((a, b, c, net));
        let left = ip(&["netns", "list"]).expect("list");
        for n in names {
            assert!(!left.contains(&n), "{n} is deleted: {left}");
        }
    }
}
