//! Disruption budgets over a simple App (`web`: one role, no persistent
//! data), driven through the CLI as an operator would.

use std::path::Path;
use std::time::Duration;

use herd_core::kinds::{DisruptionBudget, DisruptionBudgetSpec};

use super::{TestServer, eventually};

/// The members' setup: it only has to succeed.
const SETUP: &str = "true";

pub async fn budget(server: &TestServer, name: &str) -> DisruptionBudget {
    server.admin().get::<DisruptionBudgetSpec>(name).await.unwrap()
}

/// Applies App `web` (one role `w`, no persistent data), an AppCluster
/// `name` of it with `members`, and the budgets given as YAML documents.
pub fn apply_web(server: &TestServer, dir: &Path, name: &str, members: u32, budgets: &str) {
    let manifest = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: herd/v1\nkind: App\nmetadata: {{name: web}}\nspec:\n  roles:\n  - name: w\n    run: {{command: [sleep, '600']}}\n    setup: {{script: '{SETUP}'}}\n\
             ---\napiVersion: herd/v1\nkind: AppCluster\nmetadata: {{name: {name}}}\nspec:\n  appRef: web\n  roles: [{{name: w, members: {members}}}]\n{budgets}"
        ),
    )
    .unwrap();
    let out = server.cli(&["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

pub fn budget_yaml(name: &str, selector: &str, bound: &str) -> String {
    format!(
        "---\napiVersion: herd/v1\nkind: DisruptionBudget\nmetadata: {{name: {name}}}\nspec:\n  selector: {selector}\n  {bound}\n"
    )
}

/// Waits until budget `name` is counted with `healthy` healthy members and
/// `allowed` disruptions allowed.
pub async fn counted(server: &TestServer, name: &str, healthy: u32, allowed: u32) -> DisruptionBudget {
    eventually(Duration::from_secs(30), &format!("{name} at {healthy} healthy, {allowed} allowed"), || async {
        let b = budget(server, name).await;
        let s = &b.status;
        (s.observed_generation == b.metadata.generation
            && s.current_healthy == healthy
            && s.disruptions_allowed == allowed)
            .then_some(b)
    })
    .await
}
