//! What an agent reports (in its join and in each heartbeat), checked
//! before any of it is stored: a node's token lets its agent report on its
//! own node, not write anything it likes into its status or its Events.
//! An address is an address, ids and versions are short words, names are
//! names, refusals are few and typed (the server words their Events).

use crate::api::{AgentReport, MAX_PEER_REFUSALS, PeerRefusal};
use crate::grant::{Access, Holder, Refusal};
use crate::validation::{FieldPath, ValidationErrors, check_name, check_node_name};

/// The longest boot id, agent version or refusal detail.
pub const MAX_WORD_LENGTH: usize = 64;
const MAX_DETAIL_LENGTH: usize = 256;
/// A signing request for one key is about a kilobyte.
const MAX_CSR_LENGTH: usize = 16 * 1024;

/// Checks `report` as a whole, naming each bad field.
/// The most members a position report may name in sync.
pub const MAX_IN_SYNC: usize = 64;

pub fn check(report: &AgentReport) -> Result<(), ValidationErrors> {
    let mut errors = ValidationErrors::new();
    check_id(&FieldPath::root("agentBootId"), &report.agent_boot_id, &mut errors);
    if let Some(host_boot_id) = &report.host_boot_id {
        check_id(&FieldPath::root("hostBootId"), host_boot_id, &mut errors);
    }
    if let Some(address) = &report.address
        && address.parse::<std::net::SocketAddr>().is_err()
    {
        errors.add(&FieldPath::root("address"), "must be an IP address and port, like 10.0.0.5:7781");
    }
    if let Some(version) = &report.agent_version {
        check_text(&FieldPath::root("agentVersion"), version, MAX_WORD_LENGTH, &mut errors);
    }
    if report.csr.as_ref().is_some_and(|csr| csr.len() > MAX_CSR_LENGTH) {
        errors.add(&FieldPath::root("csr"), format!("must be at most {MAX_CSR_LENGTH} bytes"));
    }
    let members = FieldPath::root("members");
    for (i, member) in report.members.iter().enumerate() {
        let path = members.key(&i.to_string());
        check_name(&path.child("name"), &member.name, &mut errors);
        for (j, volume) in member.lost_volumes.iter().enumerate() {
            check_name(&path.child("lostVolumes").key(&j.to_string()), volume, &mut errors);
        }
        if let Some(position) = &member.position {
            let path = path.child("position");
            check_text(&path.child("position"), &position.position, MAX_WORD_LENGTH, &mut errors);
            let in_sync = position.in_sync.as_deref().unwrap_or_default();
            if in_sync.len() > MAX_IN_SYNC {
                errors.add(&path.child("inSync"), format!("must name at most {MAX_IN_SYNC} members"));
            }
            for (j, name) in in_sync.iter().enumerate() {
                check_name(&path.child("inSync").key(&j.to_string()), name, &mut errors);
            }
        }
    }
    let refusals = FieldPath::root("peerRefusals");
    if report.peer_refusals.len() > MAX_PEER_REFUSALS {
        errors.add(&refusals, format!("must list at most {MAX_PEER_REFUSALS} refusals (the newest)"));
    }
    for (i, refusal) in report.peer_refusals.iter().enumerate() {
        check_refusal(&refusals.key(&i.to_string()), refusal, &mut errors);
    }
    errors.into_result()
}

/// An id as agents make them (a UUID, a host's boot id): letters, digits,
/// `-`, `_` and `.`.
fn check_id(path: &FieldPath, id: &str, errors: &mut ValidationErrors) {
    if id.is_empty() {
        errors.add(path, "must not be empty");
    } else if id.len() > MAX_WORD_LENGTH {
        errors.add(path, format!("must be at most {MAX_WORD_LENGTH} characters, is {}", id.len()));
    } else if let Some(bad) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        errors.add(path, format!("may contain only letters, digits, '-', '_' and '.', found {bad:?}"));
    }
}

/// Printable text of at most `limit` bytes, on one line, without markup.
fn check_text(path: &FieldPath, text: &str, limit: usize, errors: &mut ValidationErrors) {
    if text.len() > limit {
        errors.add(path, format!("must be at most {limit} bytes, is {}", text.len()));
    } else if let Some(bad) = text.chars().find(|c| c.is_control() || matches!(c, '<' | '>')) {
        errors.add(path, format!("must be printable text on one line without '<' or '>', found {bad:?}"));
    }
}

fn check_holder(path: &FieldPath, holder: &Holder, errors: &mut ValidationErrors) {
    if let Holder::Node(node) = holder {
        check_node_name(&path.child("node"), node, errors);
    }
}

fn check_access(path: &FieldPath, access: &Access, errors: &mut ValidationErrors) {
    match access {
        Access::ReadVolume { member, volume } => {
            check_name(&path.child("member"), member, errors);
            check_name(&path.child("volume"), volume, errors);
        }
        Access::ReadLogs { member }
        | Access::StopMember { member }
        | Access::StartMember { member }
        | Access::ForgetMember { member } => check_name(&path.child("member"), member, errors),
        Access::ListVolumes | Access::ReadConfiguration | Access::AdoptMaster { .. } => {}
    }
}

fn check_refusal(path: &FieldPath, refusal: &PeerRefusal, errors: &mut ValidationErrors) {
    if let Some(caller) = &refusal.caller {
        check_holder(&path.child("caller"), caller, errors);
    }
    check_access(&path.child("asked"), &refusal.asked, errors);
    let reason = path.child("reason");
    match &refusal.reason {
        Refusal::Missing | Refusal::Anonymous | Refusal::Expired { .. } => {}
        Refusal::Invalid(detail) => check_text(&reason.child("invalid"), detail, MAX_DETAIL_LENGTH, errors),
        Refusal::NotHolder { holder, caller } => {
            check_holder(&reason.child("holder"), holder, errors);
            check_holder(&reason.child("caller"), caller, errors);
        }
        Refusal::OtherNode { grant_node, here } => {
            check_node_name(&reason.child("grantNode"), grant_node, errors);
            check_node_name(&reason.child("here"), here, errors);
        }
        Refusal::OutOfScope { granted, asked } => {
            check_access(&reason.child("granted"), granted, errors);
            check_access(&reason.child("asked"), asked, errors);
        }
        Refusal::Ended { attempt } => check_name(&reason.child("attempt").child("command"), &attempt.command, errors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;

    fn report() -> AgentReport {
        AgentReport {
            agent_boot_id: "0193b8c2-7d1e-7a40-9c4e-1f2a3b4c5d6e".into(),
            host_boot_id: Some("5e1f0c3a-2b4d-4e6f-8a9b-0c1d2e3f4a5b".into()),
            address: Some("127.0.0.1:7781".into()),
            agent_version: Some("0.1.0 (simulated)".into()),
            ..Default::default()
        }
    }

    fn fields(report: &AgentReport) -> Vec<String> {
        check(report).err().map(|e| e.errors.into_iter().map(|e| e.field).collect()).unwrap_or_default()
    }

    #[test]
    fn an_agents_own_report_passes() {
        assert_eq!(check(&report()), Ok(()));
        let ipv6 = AgentReport { address: Some("[::1]:7781".into()), ..report() };
        assert_eq!(check(&ipv6), Ok(()));
    }

    #[test]
    fn markup_or_a_name_in_place_of_an_address_is_refused() {
        for address in ["<img src=x onerror=alert(10)>", "node-2", "127.0.0.1", "10.99.0.1:99999", ""] {
            let bad = AgentReport { address: Some(address.into()), ..report() };
            assert_eq!(fields(&bad), ["address"], "{address:?}");
        }
        let bad = AgentReport { agent_boot_id: "<b>".into(), agent_version: Some("1\n2".into()), ..report() };
        assert_eq!(fields(&bad), ["agentBootId", "agentVersion"]);
    }

    #[test]
    fn refusals_are_few_and_name_only_names() {
        let refusal = |caller: &str, member: &str| PeerRefusal {
            caller: Some(Holder::Node(caller.into())),
            asked: Access::StopMember { member: member.into() },
            reason: Refusal::Missing,
            at: Timestamp::from_system_time(std::time::UNIX_EPOCH),
        };
        let good = AgentReport { peer_refusals: vec![refusal("node-2", "web-1")], ..report() };
        assert_eq!(check(&good), Ok(()));
        let forged = AgentReport { peer_refusals: vec![refusal("node 2 <script>", "Web 1")], ..report() };
        assert_eq!(fields(&forged), ["peerRefusals[0].caller.node", "peerRefusals[0].asked.member"]);
        let many = AgentReport { peer_refusals: vec![refusal("node-2", "web-1"); MAX_PEER_REFUSALS + 1], ..report() };
        assert_eq!(fields(&many), ["peerRefusals"]);
    }
}
