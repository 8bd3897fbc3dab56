//! A network of real hosts for partition tests: each host is a Linux network
//! namespace joined to a private bridge by a veth pair, so a test can cut,
//! heal and thin out the traffic between any two of them with `iptables`
//! rules inside the namespaces, and nothing leaves the subnet it made.
//!
//! - [`Net::new`] takes a free subnet `10.200-203.x.0/24` (an `flock`ed file
//!   per subnet under the temp dir, so parallel tests and test binaries never
//!   share one), makes the bridge `mb<idx>` in the root namespace and gives
//!   it `.1`: the test process itself is the host [`Net::observer`].
//! - [`Net::host`] makes a namespace `mu-<idx>-<pid>-<label>` with its own
//!   address; programs run in it through [`Host::command`] (`ip netns exec`,
//!   which execs, so the child's pid is the program's).
//! - [`Net::local`] adds another address of the root namespace on the bridge:
//!   a "host" for in-process workers, whose HTTP clients bind it
//!   ([`Host::http`]), so one worker can be cut from one node.
//! - [`Net::cut`], [`Net::cut_oneway`], [`Net::lose`] and [`Net::heal`] add
//!   and remove `DROP` rules. A rule lives in the receiving host's `INPUT`
//!   chain or the sending host's `OUTPUT` chain, whichever is a namespace of
//!   this net: the root namespace's tables are never touched.
//!
//! There is no `netem` in this machine's kernel: latency comes from a
//! [`super::FaultProxy`] bound to a [`Net::local`] address.
//!
//! Teardown on drop, also while panicking, also after a partial setup:
//! processes ([`Proc`]) are SIGKILLed, namespaces and the bridge deleted.
//! A net left behind by a killed test process is swept by the next
//! [`Net::new`] that takes its subnet.
//!
//! Needs root, `ip` and `iptables`. [`Net::new_or_skip`] prints a SKIP line
//! and returns `None` where they are missing, unless `MUSTER_REQUIRE_NETNS=1`
//! (CI sets it), where it panics.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Subnets to pick from: `10.200.0.0` to `10.203.255.0`, one `/24` each.
const SUBNETS: u32 = 1024;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One host of a [`Net`]: a namespace, or (`ns == None`) an address of the
/// test process's own namespace.
#[derive(Clone, Debug)]
pub struct Host {
    pub label: String,
    pub ip: Ipv4Addr,
    pub ns: Option<String>,
}

impl Host {
    /// `program` run inside this host's namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    /// An HTTP client whose connections leave from this host's address
    /// (only for [`Net::local`] hosts and the observer), with `timeout` per
    /// request.
    pub fn http(&self, timeout: Duration) -> reqwest::Client {
        assert!(
            self.ns.is_none(),
            "{} lives in a namespace: run a process there",
            self.label
        );
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::V4(self.ip))
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .unwrap()
    }
}

/// A child process that is SIGKILLed (its process group too) and reaped on drop.
pub struct Proc {
    pub child: Option<Child>,
}

impl Proc {
    /// Starts `cmd` in a process group of its own.
    pub fn spawn(cmd: &mut Command) -> Proc {
        use std::os::unix::process::CommandExt;
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        Proc { child: Some(child) }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the group of our own unreaped child.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether it exited (reaping it then).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(_))) => {
                self.child = None;
                true
            }
            Some(_) => false,
            None => true,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `DROP` rule as added: the namespace and the rule's arguments after `-A`.
type Rule = (String, Vec<String>);

pub struct Net {
    idx: u32,
    bridge: String,
    /// Held for the net's lifetime: the subnet is ours.
    _lock: File,
    hosts: Mutex<Vec<Host>>,
    rules: Mutex<Vec<Rule>>,
    pub observer: Host,
}

/// Runs `ip`/`iptables`; the error names the command and its stderr.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) {
    if let Err(e) = run(program, args) {
        panic!("netns harness: {e}");
    }
}

impl Net {
    /// A new net, or why none can be made here.
    pub fn new() -> Result<Net, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        for tool in ["ip", "iptables"] {
            run(tool, &["-V"]).map_err(|e| format!("`{tool}` is missing ({e})"))?;
        }
        let dir = std::env::temp_dir().join("muster-netns");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let start = std::process::id()
            .wrapping_mul(37)
            .wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 7);
        let mut taken = None;
        for i in 0..SUBNETS {
            let idx = (start + i) % SUBNETS;
            let f = File::create(dir.join(format!("{idx}.lock"))).map_err(|e| e.to_string())?;
            // SAFETY: flock on a file we own; released when it is closed (or we die).
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                taken = Some((idx, f));
                break;
            }
        }
        let (idx, lock) = taken.ok_or("every subnet is taken")?;
        let bridge = format!("mb{idx}");
        sweep(idx, &bridge);
        let observer = Host {
            label: "observer".into(),
            ip: Self::addr(idx, 1),
            ns: None,
        };
        let net = Net {
            idx,
            bridge: bridge.clone(),
            _lock: lock,
            hosts: Mutex::new(vec![observer.clone()]),
            rules: Mutex::default(),
            observer,
        };
        // Probe: a net that cannot be made is a skip, not a failure.
        run("ip", &["link", "add", "name", &bridge, "type", "bridge"])?;
        run(
            "ip",
            &["addr", "add", &format!("{}/24", net.observer.ip), "dev", &bridge],
        )?;
        run("ip", &["link", "set", &bridge, "up"])?;
        Ok(net)
    }

    /// [`Net::new`], or `None` after printing why the test is skipped;
    /// panics instead when `MUSTER_REQUIRE_NETNS=1`.
    pub fn new_or_skip(test: &str) -> Option<Net> {
        match Net::new() {
            Ok(n) => Some(n),
            Err(e) if std::env::var("MUSTER_REQUIRE_NETNS").as_deref() == Ok("1") => {
                panic!("{test}: network namespaces are required (MUSTER_REQUIRE_NETNS=1) but: {e}")
            }
            Err(e) => {
                eprintln!("SKIP {test}: no network namespaces here ({e}); run as root with iproute2 and iptables");
                None
            }
        }
    }

    fn addr(idx: u32, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 200 + (idx / 256) as u8, (idx % 256) as u8, host)
    }

    fn next_addr(&self) -> (u8, Ipv4Addr) {
        let n = self.hosts.lock().unwrap().len();
        assert!(n < 250, "too many hosts");
        let h = n as u8 + 1;
        (h, Self::addr(self.idx, h))
    }

    /// A new namespace joined to the bridge, loopback up.
    pub fn host(&self, label: &str) -> Host {
        let (h, ip) = self.next_addr();
        let ns = format!("mu-{}-{}-{label}", self.idx, std::process::id());
        let host = Host {
            label: label.into(),
            ip,
            ns: Some(ns.clone()),
        };
        // Registered first: a setup that fails half-way is still torn down.
        self.hosts.lock().unwrap().push(host.clone());
        let (outer, inner) = (format!("mv{}h{h}", self.idx), format!("mv{}n{h}", self.idx));
        must("ip", &["netns", "add", &ns]);
        must("ip", &["link", "add", &outer, "type", "veth", "peer", "name", &inner]);
        must("ip", &["link", "set", &outer, "master", &self.bridge]);
        must("ip", &["link", "set", &outer, "up"]);
        must("ip", &["link", "set", &inner, "netns", &ns]);
        let cidr = format!("{ip}/24");
        for args in [
            vec!["addr", "add", cidr.as_str(), "dev", inner.as_str()],
            vec!["link", "set", inner.as_str(), "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut full = vec!["netns", "exec", ns.as_str(), "ip"];
            full.extend(args);
            must("ip", &full);
        }
        host
    }

    /// Another address of the test process's namespace, on the bridge.
    pub fn local(&self, label: &str) -> Host {
        let (_, ip) = self.next_addr();
        let host = Host {
            label: label.into(),
            ip,
            ns: None,
        };
        self.hosts.lock().unwrap().push(host.clone());
        must("ip", &["addr", "add", &format!("{ip}/32"), "dev", &self.bridge]);
        host
    }

    /// Drops every packet from `from` to `to` (the other way still flows).
    pub fn cut_oneway(&self, from: &Host, to: &Host) {
        self.add_rule(from, to, &[]);
    }

    /// Drops every packet between `a` and `b`, both ways.
    pub fn cut(&self, a: &Host, b: &Host) {
        self.cut_oneway(a, b);
        self.cut_oneway(b, a);
    }

    /// Drops every TCP packet from `from` to `to` that carries `needle` (an
    /// HTTP request line, say): one kind of message is lost, every other
    /// one on the same connection still flows. `heal` removes it.
    pub fn drop_containing(&self, from: &Host, to: &Host, needle: &str) {
        self.add_rule(
            from,
            to,
            &["-p", "tcp", "-m", "string", "--string", needle, "--algo", "bm"],
        );
    }

    /// Drops each packet from `from` to `to` with probability `p` (0..1).
    pub fn lose(&self, from: &Host, to: &Host, p: f64) {
        let p = format!("{p}");
        self.add_rule(from, to, &["-m", "statistic", "--mode", "random", "--probability", &p]);
    }

    /// Removes every rule between `a` and `b`, both ways.
    pub fn heal(&self, a: &Host, b: &Host) {
        let ips = [a.ip.to_string(), b.ip.to_string()];
        let mut rules = self.rules.lock().unwrap();
        rules.retain(|(ns, args)| {
            let touches = |ip: &String| args.iter().any(|a| a == &format!("{ip}/32"));
            if touches(&ips[0]) && touches(&ips[1]) {
                let mut full = vec!["netns", "exec", ns.as_str(), "iptables", "-D"];
                full.extend(args.iter().map(String::as_str));
                must("ip", &full);
                false
            } else {
                true
            }
        });
    }

    fn add_rule(&self, from: &Host, to: &Host, extra: &[&str]) {
        let (s, d) = (format!("{}/32", from.ip), format!("{}/32", to.ip));
        let (ns, mut args) = match (&to.ns, &from.ns) {
            (Some(ns), _) => (ns.clone(), vec!["INPUT", "-s", &s, "-d", &d]),
            (None, Some(ns)) => (ns.clone(), vec!["OUTPUT", "-s", &s, "-d", &d]),
            (None, None) => panic!("{} and {} both live in the root namespace", from.label, to.label),
        };
        args.extend(extra);
        args.extend(["-j", "DROP"]);
        let mut full = vec!["netns", "exec", ns.as_str(), "iptables", "-A"];
        full.extend(args.iter().copied());
        must("ip", &full);
        self.rules
            .lock()
            .unwrap()
            .push((ns, args.iter().map(|a| a.to_string()).collect()));
    }
}

/// Removes what a dead test process left on subnet `idx`.
fn sweep(idx: u32, bridge: &str) {
    let _ = run("ip", &["link", "del", bridge]);
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let prefix = format!("mu-{idx}-");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with(&prefix) {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end, and so the pair.
        for h in self.hosts.lock().unwrap().iter() {
            if let Some(ns) = &h.ns {
                let _ = run("ip", &["netns", "del", ns]);
            }
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}
