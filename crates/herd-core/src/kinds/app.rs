//! `App`: the reusable definition of a piece of software (KubeDirector's
//! app kind): its roles, and per role the process a member runs, its named
//! ports, an optional setup script, the roles whose membership changes it
//! wants to hear of (`notifies`), a readiness check and placement hints.
//! An `AppCluster` is one instance of an App.

use crate::descriptor::{Cell, Column};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::NoStatus;
use super::command::MemberRun;
use super::member_run::SCRIPT_TIMEOUT_RANGE;
use crate::resource::{Object, Resource};
use crate::time::HumanDuration;
use crate::validation::{FieldPath, ValidationErrors, check_duration, check_unique_names};

pub type App = Object<AppSpec>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppSpec {
    /// For people: what the app is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub roles: Vec<AppRole>,
    /// What an upgrade of a cluster to this revision must know.
    #[serde(default, skip_serializing_if = "UpgradeRules::is_empty")]
    pub upgrade: UpgradeRules,
}

/// What an App says of upgrades to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeRules {
    /// Set when an upgrade to this revision cannot be undone (it migrates
    /// data the revision before cannot read): why. Such an upgrade that
    /// fails stops and says so instead of reverting, and no cluster that
    /// runs it is taken back to an earlier revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irreversible: Option<String>,
    /// Run in each member's setup when it is restarted as this revision
    /// from another, before and after `--configure`, with
    /// `HERD_FROM_REVISION` and `HERD_TO_REVISION` set; one that fails
    /// fails the setup (config error), which stops the upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_upgrade: Option<SetupScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_upgrade: Option<SetupScript>,
}

impl UpgradeRules {
    pub fn is_empty(&self) -> bool {
        *self == UpgradeRules::default()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppRole {
    pub name: String,
    /// The process each member of the role runs, and its volumes.
    pub run: MemberRun,
    /// Ports allocated per node for each member, passed as `HERD_PORT_<NAME>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<NamedPort>,
    /// Run as `<script> --configure` once a member is placed, and with
    /// `--addnodes`/`--delnodes` for the notifies this role asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<SetupScript>,
    /// The roles whose members coming and going this role's members are
    /// told of; a role not listed sends this one no notifies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifies: Vec<String>,
    /// How this role's members are sent their notifies: one member at a
    /// time (the default: a change such as `etcdctl member remove` is made
    /// once, and the others find it made), or all at once.
    #[serde(default, skip_serializing_if = "NotifyOrder::is_default")]
    pub notify_order: NotifyOrder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ReadinessCheck>,
    #[serde(default)]
    pub placement: Placement,
    /// One member of the role leads it (a primary) under a lease with a
    /// term; the others follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderSpec>,
}

/// How a role's leader is kept: its lease's times (the rules of the
/// control plane's election), the hooks that make a member the leader and
/// take it back, and how the app says how far each member has come.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderSpec {
    /// How long a lease lasts without a renewal: the longest a role whose
    /// leader is lost waits for the next [default: 10s].
    #[serde(default = "default_leader_lease")]
    pub lease_duration: HumanDuration,
    /// A leader not renewed for this long fences itself: its demote hook
    /// runs, then its processes end [default: 7s].
    #[serde(default = "default_leader_renew")]
    pub renew_deadline: HumanDuration,
    /// How often the lease is renewed [default: 2s].
    #[serde(default = "default_leader_retry")]
    pub retry_period: HumanDuration,
    /// Run on a member granted the lease, with `HERD_LEADER_TERM`.
    pub promote: LeaderHook,
    /// Run on a leader that lost its lease, before its processes end.
    pub demote: LeaderHook,
    /// Prints how far the member has come: a number, or an LSN such as
    /// `16/B374D848`; the most advanced member that may lead is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<LeaderHook>,
    /// Only a member the leader reports in sync (every acknowledged write
    /// is on it) is made the next leader; with none, the role waits. The
    /// lease's renewals bring the leader the members herd has on record as
    /// in sync (`inSync` in its term file): the app keeps a replica holding
    /// up its commits until it is off that record, so a leader cut off
    /// from herd acknowledges nothing its successor lacks.
    #[serde(default)]
    pub synchronous: bool,
}

impl LeaderSpec {
    pub fn times(&self) -> crate::role_leader::LeaseTimes {
        crate::role_leader::LeaseTimes {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }

    fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        for breach in self.times().breaches() {
            errors.add(&path.child(breach.field), breach.reason);
        }
        let hooks =
            [("promote", Some(&self.promote)), ("demote", Some(&self.demote)), ("position", self.position.as_ref())];
        for (name, hook) in hooks {
            if let Some(hook) = hook {
                let path = path.child(name);
                if hook.script.trim().is_empty() {
                    errors.add(&path.child("script"), "must not be empty");
                }
                check_duration(&path.child("timeout"), hook.timeout, SCRIPT_TIMEOUT_RANGE, errors);
            }
        }
        if self.synchronous && self.position.is_none() {
            errors.add(
                &path.child("synchronous"),
                "needs a position command: only a member the app reports in sync may be made the leader",
            );
        }
    }
}

/// A script run in a member's environment for its role's leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderHook {
    /// The script's text (run by `sh`).
    pub script: String,
    /// How long one run may take [default: 30s].
    #[serde(default = "default_hook_timeout")]
    pub timeout: HumanDuration,
}

fn default_leader_lease() -> HumanDuration {
    HumanDuration::from_secs(10)
}

fn default_leader_renew() -> HumanDuration {
    HumanDuration::from_secs(7)
}

fn default_leader_retry() -> HumanDuration {
    HumanDuration::from_secs(2)
}

fn default_hook_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamedPort {
    /// Lowercase letters, digits and `-`; `HERD_PORT_` + the name in upper
    /// case with `_` for `-` is the variable.
    pub name: String,
}

impl NamedPort {
    /// The environment variable that carries the port.
    pub fn variable(&self) -> String {
        format!("HERD_PORT_{}", self.name.to_ascii_uppercase().replace('-', "_"))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetupScript {
    /// The script's text (run by `sh` in the member's environment).
    pub script: String,
    /// How long one run may take [default: 5m].
    #[serde(default = "default_setup_timeout")]
    pub timeout: HumanDuration,
}

fn default_setup_timeout() -> HumanDuration {
    HumanDuration::from_secs(300)
}

/// How the agent tells that a running member is ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadinessCheck {
    #[serde(flatten, deserialize_with = "crate::objects_only::object")]
    pub probe: Probe,
    /// How often it is run [default: 5s].
    #[serde(default = "default_period")]
    pub period: HumanDuration,
    /// A run that takes longer fails [default: 2s].
    #[serde(default = "default_probe_timeout")]
    pub timeout: HumanDuration,
    /// Failed runs in a row that make a ready member not ready [default:
    /// 1]. More lets a member, a leader above all, ride out a run that was
    /// late on a loaded host (Kubernetes' `failureThreshold`); a member not
    /// ready is ready at its first run that passes.
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
}

fn default_failure_threshold() -> u32 {
    1
}

fn default_period() -> HumanDuration {
    HumanDuration::from_secs(5)
}

fn default_probe_timeout() -> HumanDuration {
    HumanDuration::from_secs(2)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Probe {
    /// A command run in the member's environment; exit 0 is ready.
    Command(Vec<String>),
    /// One of the role's named ports accepts a TCP connection.
    TcpPort(String),
}

/// How a role's members are sent their notifies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NotifyOrder {
    /// One member of the role at a time, the lowest index first: the next
    /// is sent its notify once the one before has delivered or failed.
    #[default]
    OneAtATime,
    /// Every member of the role at once.
    Parallel,
}

impl NotifyOrder {
    fn is_default(&self) -> bool {
        *self == NotifyOrder::OneAtATime
    }
}

/// Where a role's members may go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placement {
    /// Members of one role on different nodes: preferred, or required
    /// (a member that cannot be placed so is reported, not doubled up).
    #[serde(default)]
    pub spread: Spread,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Spread {
    #[default]
    Preferred,
    Required,
}

impl AppSpec {
    pub fn role(&self, name: &str) -> Option<&AppRole> {
        self.roles.iter().find(|r| r.name == name)
    }
}

impl AppRole {
    fn validate(&self, app: &AppSpec, path: &FieldPath, errors: &mut ValidationErrors) {
        self.run.validate(&path.child("run"), errors);
        check_unique_names(&path.child("ports"), self.ports.iter().map(|p| p.name.as_str()), errors);
        for (i, port) in self.ports.iter().enumerate() {
            if port.name.contains('.') {
                errors.add(&path.child("ports").key(&i.to_string()).child("name"), "may not contain '.'");
            }
        }
        if let Some(setup) = &self.setup {
            if setup.script.trim().is_empty() {
                errors.add(&path.child("setup").child("script"), "must not be empty");
            }
            check_duration(&path.child("setup").child("timeout"), setup.timeout, SCRIPT_TIMEOUT_RANGE, errors);
        }
        for (i, role) in self.notifies.iter().enumerate() {
            if app.role(role).is_none() {
                errors.add(&path.child("notifies").key(&i.to_string()), format!("no role is named {role:?}"));
            }
        }
        if !self.notifies.is_empty() && self.setup.is_none() {
            errors.add(&path.child("notifies"), "a role without a setup script cannot be notified");
        }
        if let Some(check) = &self.readiness {
            let path = path.child("readiness");
            check.validate(&path, errors);
            if let Probe::TcpPort(port) = &check.probe
                && !self.ports.iter().any(|p| p.name == *port)
            {
                errors.add(&path.child("tcpPort"), format!("no port of this role is named {port:?}"))
            }
        }
        if let Some(leader) = &self.leader {
            leader.validate(&path.child("leader"), errors);
        }
        // The role's own fields fill these in for each member: set under
        // `run` they would be replaced without a word.
        let run_only = [
            ("readiness", self.run.readiness.is_some(), "the role's readiness"),
            ("demote", self.run.demote.is_some(), "the role's leader.demote"),
            ("position", self.run.position.is_some(), "the role's leader.position"),
        ];
        for (field, set, instead) in run_only {
            if set {
                errors.add(&path.child("run").child(field), format!("is set by herd from {instead}: set that instead"));
            }
        }
        if self.run.volumes.iter().any(|v| v.name == HERD_VOLUME) {
            errors.add(&path.child("run").child("volumes"), format!("{HERD_VOLUME:?} is herd's own volume name"));
        }
    }
}

/// The volume herd adds to every app-cluster member: its configmeta, setup
/// script and setup status; persistent when any of the role's volumes is.
pub const HERD_VOLUME: &str = "herd";

/// The longest App name: 253 less a revision's `-<generation>`.
pub const MAX_APP_NAME_LENGTH: usize = 233;

impl ReadinessCheck {
    pub(crate) fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if let Probe::Command(command) = &self.probe
            && command.first().is_none_or(|c| c.is_empty())
        {
            errors.add(&path.child("command"), "must name a program to run")
        }
        if self.period.get().is_zero() {
            errors.add(&path.child("period"), "must be positive");
        }
        if self.timeout.get().is_zero() || self.timeout > self.period {
            errors.add(&path.child("timeout"), format!("must be positive and at most the period ({})", self.period));
        }
        if self.failure_threshold == 0 {
            errors.add(&path.child("failureThreshold"), "must be at least 1 (one failed run makes it not ready)");
        }
    }
}

impl Resource for AppSpec {
    const KIND: &'static str = "App";
    const PLURAL: &'static str = "apps";
    const SHORT: &'static str = "app";
    const REPLICATED: bool = true;
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("ROLES", Cell::Each { path: "/spec/roles", field: "/name" }),
        Column::AGE,
        Column::wide("DESCRIPTION", Cell::Text { path: "/spec/description" }),
    ];
    const HAS_STATUS: bool = false;
    type Status = NoStatus;

    fn validate_name(name: &str, errors: &mut ValidationErrors) {
        // Room for its revisions' names, `<app>-<generation>`.
        if name.len() > MAX_APP_NAME_LENGTH {
            errors.add(
                &FieldPath::root("metadata").child("name"),
                format!("an App's name is at most {MAX_APP_NAME_LENGTH} characters (its revisions are named `<app>-<revision>`)"),
            );
        }
    }

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.roles.is_empty() {
            errors.add(&path.child("roles"), "an app needs at least one role");
        }
        check_unique_names(&path.child("roles"), self.roles.iter().map(|r| r.name.as_str()), errors);
        for (i, role) in self.roles.iter().enumerate() {
            role.validate(self, &path.child("roles").key(&i.to_string()), errors);
        }
        if self.upgrade.irreversible.as_deref().is_some_and(|why| why.trim().is_empty()) {
            errors.add(
                &path.child("upgrade").child("irreversible"),
                "must say why (it is shown when a revert is refused)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: serde_json::Value) -> Result<App, ValidationErrors> {
        let app = App::from_json_value(serde_json::json!({"metadata": {"name": "etcd"}, "spec": spec}))?;
        app.validate().map(|()| app)
    }

    fn fields(error: ValidationErrors) -> Vec<String> {
        error.errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_whole_app_reads_with_its_defaults() {
        let app = parse(serde_json::json!({"roles": [{
            "name": "member",
            "run": {"command": ["etcd"], "volumes": [{"name": "data", "persistent": true}]},
            "ports": [{"name": "client"}, {"name": "peer-urls"}],
            "setup": {"script": "exec ./configure \"$@\""},
            "notifies": ["member"],
            "readiness": {"tcpPort": "client"}
        }]}))
        .unwrap();
        let role = &app.spec.roles[0];
        assert_eq!(role.setup.as_ref().unwrap().timeout, HumanDuration::from_secs(300));
        let check = role.readiness.as_ref().unwrap();
        assert_eq!((check.period, check.timeout), (HumanDuration::from_secs(5), HumanDuration::from_secs(2)));
        assert_eq!(check.failure_threshold, 1);
        assert_eq!(role.placement.spread, Spread::Preferred);
        assert_eq!(role.ports[1].variable(), "HERD_PORT_PEER_URLS");
    }

    #[test]
    fn a_readiness_threshold_of_zero_is_refused_naming_it() {
        let role = |threshold: u32| {
            serde_json::json!({"roles": [{"name": "a", "run": {"command": ["x"]}, "ports": [{"name": "p"}],
                "readiness": {"tcpPort": "p", "failureThreshold": threshold}}]})
        };
        assert_eq!(parse(role(3)).unwrap().spec.roles[0].readiness.as_ref().unwrap().failure_threshold, 3);
        assert_eq!(fields(parse(role(0)).unwrap_err()), ["spec.roles[0].readiness.failureThreshold"]);
    }

    #[test]
    fn bad_roles_are_named_by_their_field() {
        let error = parse(serde_json::json!({"roles": []})).unwrap_err();
        assert_eq!(fields(error), ["spec.roles"]);
        let error = parse(serde_json::json!({"roles": [
            {"name": "a", "run": {"command": ["x"]}, "notifies": ["ghost"], "setup": {"script": "s"}},
            {"name": "a", "run": {"command": []}, "ports": [{"name": "p"}, {"name": "p"}], "readiness": {"tcpPort": "q"}},
            {"name": "c", "run": {"command": ["x"]}, "notifies": ["a"]}
        ]}))
        .unwrap_err();
        assert_eq!(
            fields(error),
            [
                "spec.roles[1].name",
                "spec.roles[0].notifies[0]",
                "spec.roles[1].run.command",
                "spec.roles[1].ports[1].name",
                "spec.roles[1].readiness.tcpPort",
                "spec.roles[2].notifies",
            ]
        );
    }

    #[test]
    fn bad_resources_and_fields_herd_fills_in_are_named_by_their_field() {
        let role = |run: serde_json::Value| serde_json::json!({"roles": [{"name": "db", "run": run}]});
        let app =
            parse(role(serde_json::json!({"command": ["redis-server"], "resources": {"cpu": 2, "memory": "1Gi"}})))
                .unwrap();
        assert_eq!(app.spec.roles[0].run.resources.requests().memory, crate::quantity::Bytes(1 << 30));
        for (resources, field, reason) in [
            (serde_json::json!({"cpu": -1}), "spec.roles[0].run.resources.cpu", "negative"),
            (serde_json::json!({"memory": "12XB"}), "spec.roles[0].run.resources.memory", "\"12XB\" is not a number"),
        ] {
            let error = parse(role(serde_json::json!({"command": ["x"], "resources": resources}))).unwrap_err();
            assert_eq!(error.errors[0].field, field);
            assert!(error.errors[0].reason.contains(reason), "{error}");
        }
        let error =
            parse(role(serde_json::json!({"command": ["x"], "resources": {"memory": "1Gi", "memoryMax": "64Mi"},
            "readiness": {"tcpPort": "client"}})))
            .unwrap_err();
        assert_eq!(fields(error), ["spec.roles[0].run.resources.memoryMax", "spec.roles[0].run.readiness"]);
    }

    #[test]
    fn a_leader_role_reads_with_its_defaults_and_bad_leaders_are_named_by_their_field() {
        let role = |leader: serde_json::Value| serde_json::json!({"roles": [{"name": "db", "run": {"command": ["postgres"]}, "leader": leader}]});
        let app = parse(role(
            serde_json::json!({"promote": {"script": "pg_ctl promote"}, "demote": {"script": "pg_ctl stop"}}),
        ))
        .unwrap();
        let leader = app.spec.roles[0].leader.as_ref().unwrap();
        assert_eq!(leader.times().lease_duration, HumanDuration::from_secs(10));
        assert_eq!(
            (leader.renew_deadline, leader.retry_period),
            (HumanDuration::from_secs(7), HumanDuration::from_secs(2))
        );
        assert_eq!((leader.promote.timeout, leader.synchronous), (HumanDuration::from_secs(30), false));

        let missing = App::from_json_value(serde_json::json!({"metadata": {"name": "pg"}, "spec": role(serde_json::json!({"promote": {"script": "x"}}))})).unwrap_err();
        assert!(missing.to_string().contains("demote"), "{missing}");
        let error = parse(role(serde_json::json!({
            "leaseDuration": "5s", "renewDeadline": "6s", "retryPeriod": "2s",
            "promote": {"script": " "}, "demote": {"script": "x", "timeout": "0s"},
            "synchronous": true
        })))
        .unwrap_err();
        assert_eq!(
            fields(error),
            [
                "spec.roles[0].leader.leaseDuration",
                "spec.roles[0].leader.promote.script",
                "spec.roles[0].leader.demote.timeout",
                "spec.roles[0].leader.synchronous",
            ]
        );
    }
}
