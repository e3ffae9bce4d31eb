//! A network namespace a test creates for one "host", joined to this one
//! by a veth pair (10.213.N.1 here, 10.213.N.2 inside), whose link the
//! test can cut and heal. Processes started in it reach this side only
//! through the pair. Needs root (CI runs as root). Removed on drop.

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
    let status = Command::new("ip").args(args).status().expect("running ip");
    assert!(status.success(), "ip {args:?} failed: this test creates a network namespace and needs root");
}

impl NetNs {
    /// A namespace numbered `index` (0-250) for this test process.
    pub fn create(index: u8) -> NetNs {
        let tag = format!("{}{index}", std::process::id() % 100_000);
        let (name, host_link, inner_link) = (format!("herd-{tag}"), format!("vh{tag}"), format!("vn{tag}"));
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
