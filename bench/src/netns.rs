//! A network namespace a test creates for one "host", joined to this one
//! by a veth pair (10.213.N.1 here, 10.213.N.2 inside, N the first number
//! from the one asked for whose addresses no interface has), whose link
//! the test can cut and heal. Processes started in it reach this side only
//! through the pair. Needs root (CI runs as root). Removed on drop; one a
//! killed test process left (named for a process that is gone) is removed
//! by the next one made, and its addresses are never taken again while it
//! stays.

use std::process::Command;

pub struct NetNs {
    pub name: String,
    host_link: String,
    /// This side's address, as processes inside reach it.
    pub outside: String,
    /// The address inside, as this side reaches it.
    inside: String,
}

fn ip(args: &[&str]) {
    ip_output(args);
}

/// What `ip ARGS` printed; it must succeed.
fn ip_output(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(out.status.success(), "ip {args:?} failed: this test creates a network namespace and needs root");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes the namespaces (and their links) that test processes which are
/// gone left behind: `herd-PID-N`, PID no longer running.
fn remove_orphans() {
    for line in ip_output(&["netns", "list"]).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some((pid, index)) = name.strip_prefix("herd-").and_then(|tag| tag.split_once('-')) else { continue };
        if pid.parse::<u32>().is_err() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = Command::new("ip").args(["link", "del", &format!("vh{pid}-{index}")]).status();
        let _ = Command::new("ip").args(["netns", "del", name]).status();
    }
}

impl NetNs {
    /// A namespace numbered `index` (0-253), or the next number whose
    /// addresses are free.
    pub fn create(index: u8) -> NetNs {
        // Test processes (and threads) side by side pick numbers in turn.
        let lock = std::fs::File::create(std::env::temp_dir().join("herd-netns.lock")).expect("the netns lock file");
        lock.lock().expect("locking the netns lock file");
        remove_orphans();
        let taken = ip_output(&["-o", "addr", "show"]);
        let index = (0..254u16)
            .map(|i| ((u16::from(index) + i) % 254) as u8)
            .find(|i| !taken.contains(&format!(" 10.213.{i}.1/")))
            .expect("a free 10.213.N.0/30 for a test's namespace");
        let tag = format!("{}-{index}", std::process::id());
        let (name, host_link, inner_link) = (format!("herd-{tag}"), format!("vh{tag}"), format!("vn{tag}"));
        // One of this name is stale: a process gone whose pid this one has
        // now (this one's own hold their addresses, and this index's is free).
        if ip_output(&["netns", "list"]).lines().any(|l| l.split_whitespace().next() == Some(name.as_str())) {
            let _ = Command::new("ip").args(["link", "del", &host_link]).status();
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
        let (outside, inside) = (format!("10.213.{index}.1"), format!("10.213.{index}.2"));
        ip(&["netns", "add", &name]);
        let ns = NetNs {
            name: name.clone(),
            host_link: host_link.clone(),
            outside: outside.clone(),
            inside: inside.clone(),
        };
        ip(&["link", "add", &host_link, "type", "veth", "peer", "name", &inner_link]);
        ip(&["link", "set", &inner_link, "netns", &name]);
        ip(&["addr", "add", &format!("{outside}/30"), "dev", &host_link]);
        ip(&["link", "set", &host_link, "up"]);
        ip(&["netns", "exec", &name, "ip", "addr", "add", &format!("{inside}/30"), "dev", &inner_link]);
        ip(&["netns", "exec", &name, "ip", "link", "set", &inner_link, "up"]);
        ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        ns
    }

    /// The address inside, as this side reaches it.
    pub fn inside(&self) -> String {
        self.inside.clone()
    }

    /// `program` to be run inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Cuts the link: nothing gets in or out.
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_link, "down"]);
    }

    pub fn heal(&self) {
        ip(&["link", "set", &self.host_link, "up"]);
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.host_link]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}
