//! Cgroups on a fake tree (plain files where the kernel has its own): the
//! v2 paths this machine kind cannot run, and what is read back.

use super::*;
use herd_core::quantity::{Bytes, Millicores};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_v2_member_gets_its_own_cgroup_with_its_limits_under_the_agent_s_group() {
    let tree = tempfile::tempdir().unwrap();
    let own = tree.path().join("system.slice/herd-agent.service");
    std::fs::create_dir_all(&own).unwrap();
    let cgroups = Cgroups::under(Layout::Unified(own.clone()), "herd-n1-abcd1234");
    let report = cgroups.report();
    assert_eq!(report.layout, CgroupLayout::V2, "{report:?}");
    assert_eq!(read(&own.join("cgroup.subtree_control")), UNIFIED_CONTROLLERS);
    let group = own.join("herd-n1-abcd1234");
    assert_eq!(read(&group.join("cgroup.subtree_control")), UNIFIED_CONTROLLERS);

    let resources = Resources {
        cpu: Some(Millicores(250)),
        memory: Some(Bytes(128 << 20)),
        memory_max: Some(Bytes(64 << 20)),
        ..Default::default()
    };
    let cgroup = cgroups.member("db-0", &resources).unwrap().unwrap();
    let dir = group.join("db-0");
    assert_eq!(cgroup.dirs, vec![("unified".to_string(), dir.clone())]);
    assert_eq!(read(&dir.join("memory.low")), (128u64 << 20).to_string());
    assert_eq!(read(&dir.join("memory.max")), (64u64 << 20).to_string());
    assert_eq!(read(&dir.join("cpu.max")), "max 100000");
    assert_eq!(read(&dir.join("pids.max")), "4096");
    assert!(!dir.join("memory.swap.max").exists(), "a host that does not account for swap has no such file");
    // A host that accounts for swap: the cap holds swap at none.
    std::fs::create_dir_all(group.join("db-1")).unwrap();
    std::fs::write(group.join("db-1/memory.swap.max"), "max\n").unwrap();
    cgroups.member("db-1", &resources).unwrap();
    assert_eq!(read(&group.join("db-1/memory.swap.max")), "0");

    // What the kernel would count, read back.
    std::fs::write(dir.join("memory.events"), "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n").unwrap();
    std::fs::write(dir.join("memory.peak"), "67108864\n").unwrap();
    std::fs::write(dir.join("memory.current"), "50000000\n").unwrap();
    std::fs::write(dir.join("memory.stat"), "anon 40000000\ninactive_file 8000000\n").unwrap();
    std::fs::write(dir.join("cpu.stat"), "usage_usec 1500000\nuser_usec 1000000\n").unwrap();
    assert_eq!(cgroup.oom_kills(), Some(1));
    assert_eq!((cgroup.memory_limit(), cgroup.memory_peak()), (Some(64 << 20), Some(64 << 20)));
    assert_eq!(cgroup.memory_working_set(), Some(42_000_000));
    assert_eq!(cgroup.cpu_nanos(), Some(1_500_000_000));
    std::fs::write(dir.join("memory.max"), "max\n").unwrap();
    assert_eq!(cgroup.memory_limit(), None, "no cap");
}

#[test]
fn v1_members_get_a_directory_in_each_hierarchy_and_co_mounted_ones_are_joined_once() {
    let tree = tempfile::tempdir().unwrap();
    let memory = tree.path().join("memory/process_api/x");
    let cpu = tree.path().join("cpu,cpuacct");
    let layout = Layout::Legacy(vec![("memory", memory.clone()), ("cpu", cpu.clone()), ("cpuacct", cpu.clone())]);
    let cgroups = Cgroups::under(layout, "herd-n1-abcd1234");
    assert_eq!(cgroups.report().layout, CgroupLayout::V1);
    assert!(cgroups.report().detail.contains("cgroup v1 (memory, cpu, cpuacct)"), "{:?}", cgroups.report());
    let resources = Resources { cpu: Some(Millicores(1000)), ..Default::default() };
    let cgroup = cgroups.member("db-0", &resources).unwrap().unwrap();
    assert_eq!(cgroup.distinct_dirs().len(), 2);
    let cpu_dir = cpu.join("herd-n1-abcd1234/db-0");
    assert_eq!(read(&cpu_dir.join("cpu.shares")), "1024");
    assert_eq!(read(&memory.join("herd-n1-abcd1234/db-0/memory.limit_in_bytes")), "-1");
    assert!(!cpu_dir.join("pids.max").exists(), "no pids hierarchy, no pids limit");
    std::fs::write(cpu_dir.join("cpuacct.usage"), "2500000000\n").unwrap();
    assert_eq!(cgroup.cpu_nanos(), Some(2_500_000_000));
    std::fs::write(memory.join("herd-n1-abcd1234/db-0/memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
    assert_eq!(cgroup.memory_limit(), None, "v1's largest number is no cap");
}

#[test]
fn a_tree_that_cannot_be_written_leaves_members_unlimited_and_says_why() {
    let cgroups = Cgroups::under(Layout::Legacy(vec![("memory", PathBuf::from("/proc/no-such-hierarchy"))]), "g");
    let report = cgroups.report();
    assert_eq!(report.layout, CgroupLayout::None);
    assert!(report.detail.contains("making the agent's group"), "{report:?}");
    assert_eq!(cgroups.member("m", &Resources::default()).unwrap(), None);
    assert_ne!(group_name("n1", Path::new("/a")), group_name("n1", Path::new("/b")), "one group per data dir");
}

#[test]
fn cpu_use_is_a_rate_between_two_reads() {
    let tree = tempfile::tempdir().unwrap();
    let dir = tree.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    let cgroup = MemberCgroup { unified: true, dirs: vec![("unified".into(), dir.clone())] };
    std::fs::write(dir.join("cpu.stat"), "usage_usec 1000000\n").unwrap();
    std::fs::write(dir.join("memory.current"), "4096\n").unwrap();
    let meter = UsageMeter::default();
    let first = meter.read("m", &cgroup);
    assert_eq!((first.cpu, first.memory), (None, Some(Bytes(4096))), "one read is no rate");
    std::thread::sleep(std::time::Duration::from_millis(600));
    std::fs::write(dir.join("cpu.stat"), "usage_usec 1300000\n").unwrap();
    let rate = meter.read("m", &cgroup).cpu.unwrap();
    assert!((400..=500).contains(&rate.0), "0.3 s of CPU in about 0.6 s: {rate}");
    assert_eq!(meter.read("m", &cgroup).cpu, Some(rate), "a read right after keeps the rate");
    meter.keep_only(&Default::default());
    assert_eq!(meter.read("m", &cgroup).cpu, None, "forgotten");
}
