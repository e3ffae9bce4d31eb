//! Which cgroup layout the host has, read from `/proc/self/mountinfo` and
//! `/proc/self/cgroup`: cgroup v2 (one unified hierarchy, when it holds
//! the memory controller), or the v1 hierarchies of the memory, cpu,
//! cpuacct and pids controllers; and where this process's own cgroup is
//! in each. Pure: the texts are given.

use std::path::{Path, PathBuf};

/// The v1 controllers members are limited and measured by.
pub const V1_CONTROLLERS: [&str; 4] = ["memory", "cpu", "cpuacct", "pids"];

/// Where this process's own cgroups are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v2: the directory of this process's cgroup.
    Unified(PathBuf),
    /// cgroup v1: the directory of this process's cgroup in the hierarchy
    /// of each controller the host has (two controllers mounted together
    /// share one).
    Legacy(Vec<(&'static str, PathBuf)>),
}

/// One cgroup file system mount: its root within the hierarchy, where it
/// is mounted, whether it is v2, and its v1 controllers.
#[derive(Debug)]
struct Mount {
    root: String,
    point: String,
    unified: bool,
    controllers: Vec<String>,
}

fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let mut rest = after.split(' ');
            let fstype = rest.next()?;
            let options = rest.nth(1).unwrap_or_default();
            let (root, point) = (fields.get(3)?, fields.get(4)?);
            let unified = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let controllers = options.split(',').map(str::to_string).collect();
            Some(Mount { root: unescape(root), point: unescape(point), unified, controllers })
        })
        .collect()
}

/// mountinfo escapes spaces, tabs, newlines and backslashes as octal.
fn unescape(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// The directory of cgroup `path` (as `/proc/self/cgroup` has it) under
/// `mount`, with `fs_root` before the mount point (`/` on a host; a
/// fake tree's root in tests). None when the cgroup is outside the mount.
fn directory(fs_root: &Path, mount: &Mount, path: &str) -> Option<PathBuf> {
    let root = mount.root.trim_end_matches('/');
    let inside = path.strip_prefix(root)?;
    if !inside.is_empty() && !inside.starts_with('/') {
        return None;
    }
    let mut dir = fs_root.join(mount.point.trim_start_matches('/'));
    for part in inside.split('/').filter(|p| !p.is_empty()) {
        if part == ".." {
            return None;
        }
        dir.push(part);
    }
    Some(dir)
}

/// The layout, or why there is none. `unified_controllers` reads the
/// `cgroup.controllers` of a v2 directory: v2 is used when it has the
/// memory controller (a hybrid host mounts v2 with no controllers
/// beside its v1 hierarchies).
pub fn detect(
    fs_root: &Path,
    mountinfo: &str,
    self_cgroup: &str,
    unified_controllers: &dyn Fn(&Path) -> Option<String>,
) -> Result<Layout, String> {
    let mounts = mounts(mountinfo);
    let memberships: Vec<(&str, &str)> = self_cgroup
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
        .collect();
    let unified_path = memberships.iter().find(|(controllers, _)| controllers.is_empty()).map(|(_, path)| *path);
    if let Some(path) = unified_path {
        for mount in mounts.iter().filter(|m| m.unified) {
            if let Some(dir) = directory(fs_root, mount, path)
                && unified_controllers(&dir).is_some_and(|c| c.split_whitespace().any(|c| c == "memory"))
            {
                return Ok(Layout::Unified(dir));
            }
        }
    }
    let mut found = Vec::new();
    for controller in V1_CONTROLLERS {
        let mount = mounts.iter().find(|m| !m.unified && m.controllers.iter().any(|c| c == controller));
        let path = memberships.iter().find(|(cs, _)| cs.split(',').any(|c| c == controller)).map(|(_, path)| *path);
        if let (Some(mount), Some(path)) = (mount, path)
            && let Some(dir) = directory(fs_root, mount, path)
        {
            found.push((controller, dir));
        }
    }
    if found.iter().any(|(controller, _)| *controller == "memory") {
        return Ok(Layout::Legacy(found));
    }
    Err(match (mounts.is_empty(), unified_path.is_some()) {
        (true, _) => "no cgroup file system is mounted".into(),
        (false, true) => "cgroup v2 is mounted without the memory controller, and no v1 memory hierarchy is".into(),
        (false, false) => "no cgroup hierarchy has the memory controller".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine kind: v1 hierarchies, a v2 mount without controllers.
    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_SELF: &str = "8:pids:/\n4:memory:/process_api/ffc5\n2:cpuacct:/\n1:cpu:/\n0::/\n";

    fn none(_: &Path) -> Option<String> {
        Some(String::new())
    }

    #[test]
    fn v1_hierarchies_are_found_with_this_process_s_place_in_each() {
        let layout = detect(Path::new("/"), HYBRID_MOUNTS, HYBRID_SELF, &none).unwrap();
        let expected = vec![
            ("memory", PathBuf::from("/sys/fs/cgroup/memory/process_api/ffc5")),
            ("cpu", PathBuf::from("/sys/fs/cgroup/cpu")),
            ("cpuacct", PathBuf::from("/sys/fs/cgroup/cpuacct")),
            ("pids", PathBuf::from("/sys/fs/cgroup/pids")),
        ];
        assert_eq!(layout, Layout::Legacy(expected));
    }

    #[test]
    fn co_mounted_controllers_share_a_directory_and_a_container_s_root_is_stripped() {
        let mounts = "\
40 31 0:40 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
41 31 0:41 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        let own = "3:cpu,cpuacct:/docker/abc/herd\n2:memory:/docker/abc\n";
        let Layout::Legacy(found) = detect(Path::new("/fake"), mounts, own, &none).unwrap() else { panic!() };
        assert_eq!(found[0], ("memory", PathBuf::from("/fake/sys/fs/cgroup/memory")));
        assert_eq!(found[1], ("cpu", PathBuf::from("/fake/sys/fs/cgroup/cpu,cpuacct/herd")));
        assert_eq!(found[1].1, found[2].1, "cpuacct is where cpu is");
        assert_eq!(found.len(), 3, "no pids hierarchy");
    }

    #[test]
    fn v2_is_used_when_it_has_the_memory_controller() {
        let mounts = "25 20 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let own = "0::/system.slice/herd-agent.service\n";
        let controllers = |dir: &Path| {
            (dir == Path::new("/sys/fs/cgroup/system.slice/herd-agent.service")).then(|| "cpu io memory pids".into())
        };
        assert_eq!(
            detect(Path::new("/"), mounts, own, &controllers),
            Ok(Layout::Unified(PathBuf::from("/sys/fs/cgroup/system.slice/herd-agent.service")))
        );
        assert_eq!(
            detect(Path::new("/"), mounts, own, &none),
            Err("cgroup v2 is mounted without the memory controller, and no v1 memory hierarchy is".into())
        );
    }

    #[test]
    fn no_cgroups_says_why() {
        assert_eq!(detect(Path::new("/"), "", "", &none), Err("no cgroup file system is mounted".into()));
        let escaped = "35 31 0:32 /other /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            detect(Path::new("/"), escaped, "4:memory:/mine\n", &none),
            Err("no cgroup hierarchy has the memory controller".into()),
            "a cgroup outside the mount's root is not reachable"
        );
        let Layout::Legacy(found) = detect(Path::new("/"), escaped, "4:memory:/other/x\n", &none).unwrap() else {
            panic!()
        };
        assert_eq!(found[0].1, PathBuf::from("/sys/fs/cgroup/mem ory/x"));
    }
}
