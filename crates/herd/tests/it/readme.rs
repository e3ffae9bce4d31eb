//! README's commands, run as written: the "Three replicas on PostgreSQL"
//! section's block, taken from README.md itself, in a fresh directory with
//! its relative paths (`--data-dir r1`, `--data-dir a1`), then an app
//! cluster whose members write into their volumes on that agent. A
//! README that drifts from what herd does fails here.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The first ```sh block after `heading` in README.md.
fn readme_block(heading: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let after = &readme[readme.find(heading).unwrap_or_else(|| panic!("README.md has no {heading:?}"))..];
    let start = after.find("```sh\n").expect("a shell block") + "```sh\n".len();
    let end = after[start..].find("```").expect("its end");
    after[start..start + end].to_string()
}

/// Ends the process group it leads (the block's servers and agent run in
/// the background of its shell) when dropped, also when the test fails.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-9", "--", &format!("-{}", self.0)]).status();
    }
}

#[test]
fn the_postgresql_section_runs_as_written() {
    if std::env::var_os("HERD_TEST_POSTGRES_URL").is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "HERD_TEST_POSTGRES_URL is not set: CI must run the PostgreSQL tests"
        );
        eprintln!("!!! SKIPPED: HERD_TEST_POSTGRES_URL is not set; the README's PostgreSQL section did not run");
        return;
    }
    common::apps::require(&["openssl", "curl", "psql"]);
    let block = readme_block("### Three replicas on PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let _members = common::MemberReaper(dir.path().join("a1"));
    // The section's database, made anew: `createdb herd` is its first line.
    let pg = |command: &mut Command| {
        command.env("PGHOST", "127.0.0.1").env("PGUSER", "herd").env("PGPASSWORD", "herd");
    };
    let mut drop_db = Command::new("dropdb");
    drop_db.args(["--if-exists", "herd"]);
    pg(&mut drop_db);
    assert!(drop_db.status().unwrap().success());
    // What the tour then does on that cluster: an app whose members write
    // into their volumes (relative data dirs resolved once at start).
    let app = dir.path().join("app.yaml");
    std::fs::write(
        &app,
        "apiVersion: herd/v1\nkind: App\nmetadata: {name: notes}\nspec:\n  roles:\n  - name: n\n    run:\n      \
         command: [sh, -c, 'echo started >>\"$HERD_VOLUME_DATA/starts\" && exec sleep 600']\n      \
         volumes: [{name: data, persistent: true}]\n    setup: {script: 'echo set up >>\"$HERD_VOLUME_DATA/setup\"'}\n\
         ---\napiVersion: herd/v1\nkind: AppCluster\nmetadata: {name: notes}\nspec:\n  appRef: notes\n  roles: [{name: n, members: 1}]\n",
    )
    .unwrap();
    let script = format!(
        "set -eu\n{block}\nherd apply -f {app}\nherd appcluster wait notes --timeout 90s\necho README-OK\n",
        app = app.display()
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_herd")).parent().unwrap();
    let mut shell = Command::new("bash");
    shell.arg("-c").arg(&script).current_dir(dir.path()).process_group(0);
    shell.env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()));
    shell.env("HOME", dir.path()).env_remove("XDG_CONFIG_HOME");
    for key in ["HERD_SERVER", "HERD_TOKEN", "HERD_CA_HASH", "HERD_CA_FILE", "HERD_CONFIG", "HERD_STORE"] {
        shell.env_remove(key);
    }
    pg(&mut shell);
    // Files, not pipes: the servers it leaves in the background keep them.
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    shell.stdout(std::fs::File::create(&out_path).unwrap()).stderr(std::fs::File::create(&err_path).unwrap());
    shell.stdin(Stdio::null());
    let mut child = shell.spawn().unwrap();
    let _group = Group(child.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the block did not end within 4 minutes");
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.success() && stdout.contains("README-OK"), "{stdout}\n{stderr}");
    assert!(stdout.contains("Leader:") && stdout.contains("herd_leader "), "{stdout}");
    let volume = dir.path().join("a1/volumes/notes-n-0/data");
    assert_eq!(std::fs::read_to_string(volume.join("starts")).unwrap(), "started\n");
    assert_eq!(std::fs::read_to_string(volume.join("setup")).unwrap(), "set up\n");
}
