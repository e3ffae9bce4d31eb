//! `herd token create|list`: join tokens with a lifetime, kubeadm-style,
//! and viewer tokens for the dashboard.

use std::time::SystemTime;

use comfy_table::{Table, presets};
use herd_client::Client;
use herd_core::api::{JoinTokenInfo, JoinTokenRequest};
use herd_core::join::TokenKind;
use herd_core::{HumanDuration, Timestamp};

use crate::cli::OutputFormat;
use crate::output::{self, short_duration};

/// Creates a token and prints it alone on stdout (for scripts), and on
/// stderr when it expires and how an agent joins with it: the whole
/// command, with the hash of the CA this CLI trusts (an agent trusts only
/// a CA it is given).
pub async fn create(
    client: &Client,
    trust: Option<&herd_tls::Trust>,
    kind: TokenKind,
    ttl: Option<HumanDuration>,
    description: String,
) -> anyhow::Result<()> {
    let created = client.create_join_token(&JoinTokenRequest { kind, ttl, description }).await?;
    let token = created.token.clone().unwrap_or_default();
    println!("{token}");
    let until = created.expires.map_or("until deleted".to_string(), |at| format!("until {at}"));
    let servers = client.servers().join(",");
    match kind {
        TokenKind::Join => {
            let pins: String = match trust {
                Some(trust) => trust.ca_hashes()?.iter().map(|hash| format!(" --ca-hash {hash}")).collect(),
                None => String::new(),
            };
            eprintln!("join token {} (valid {until}); on a new host:", created.id);
            eprintln!("  herd agent --server {servers}{pins} --name NODE --join-token {token}");
        }
        TokenKind::Viewer => {
            eprintln!("viewer token {} (valid {until}): reads everything but tokens, changes nothing;", created.id);
            eprintln!("  log in to the dashboard with it: {}/ui", client.servers().first().map_or("", String::as_str));
        }
    }
    Ok(())
}

pub async fn list(client: &Client, format: OutputFormat) -> anyhow::Result<()> {
    let tokens = client.join_tokens().await?;
    match format {
        OutputFormat::Table | OutputFormat::Wide => {
            println!("{}", render(&tokens.items, Timestamp::from_system_time(SystemTime::now())));
            Ok(())
        }
        OutputFormat::Name => Err(crate::output::no_names("herd token list")),
        OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_) => {
            output::print("JoinTokenList", &serde_json::to_value(&tokens.items)?, &[], &format)
        }
    }
}

fn render(tokens: &[JoinTokenInfo], now: Timestamp) -> String {
    if tokens.is_empty() {
        return "no tokens (create a join token with `herd token create --ttl 1h`)".into();
    }
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(["ID", "KIND", "EXPIRES", "CREATED", "DESCRIPTION"]);
    for token in tokens {
        let expires = match token.expires {
            None => "never".to_string(),
            Some(at) if at <= now => format!("expired {} ago", short_duration(at.age(now))),
            Some(at) => format!("in {}", short_duration(now.age(at))),
        };
        let created = format!("{} ago", short_duration(token.created.age(now)));
        table.add_row([token.id.clone(), token.kind.word().into(), expires, created, token.description.clone()]);
    }
    table.lines().map(|l| l.strip_prefix(' ').unwrap_or(&l).trim_end().to_string()).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_say_when_each_token_expires() {
        let at = |secs| Timestamp::from_system_time(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        let token = |id: &str, expires| JoinTokenInfo {
            id: id.into(),
            kind: TokenKind::Join,
            description: "rack 4".into(),
            created: at(1000),
            expires,
            token: None,
        };
        let text = render(
            &[token("aaaaaa", Some(at(4600))), token("bbbbbb", Some(at(1500))), token("cccccc", None)],
            at(2000),
        );
        assert!(text.contains("aaaaaa  join  in 43m"), "{text}");
        assert!(text.contains("bbbbbb  join  expired 8m ago"), "{text}");
        assert!(text.contains("cccccc  join  never"), "{text}");
        assert!(render(&[], at(0)).contains("herd token create"));
    }
}
