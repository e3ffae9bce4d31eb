//! `herd logs TARGET [-f]`: the end of a member's log, fetched through the
//! server from its node's agent; with `-f`, then every new piece from the
//! offset reached (`herd_core::api::LOG_OFFSET_HEADER`, the stream's own
//! across its rotation), until Ctrl-C.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use herd_client::Client;
use herd_core::Resource;
use herd_core::api::LogStream;
use herd_core::kinds::MemberSpec;

/// How often a followed log is asked for more.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// The most a followed log brings at once.
const FOLLOW_CHUNK: u64 = 1 << 20;

fn write_out(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

pub async fn logs(client: &Client, target: &str, stream: LogStream, bytes: u64, follow: bool) -> anyhow::Result<()> {
    let Some((first, member)) = target.split_once('/') else {
        return Err(crate::Usage(format!("logs: give the member as member/NAME or NODE/MEMBER, got {target:?}")).into());
    };
    let mut errors = herd_core::ValidationErrors::new();
    for (field, name) in [("node or kind", first), ("member", member)] {
        herd_core::validation::check_name(&herd_core::FieldPath::root(field), name, &mut errors);
    }
    if let Err(errors) = errors.into_result() {
        return Err(crate::Usage(format!("logs {target:?}: {errors}")).into());
    }
    let node = match crate::kinds::resolve(first) {
        Ok(kind) if kind.kind == MemberSpec::KIND => {
            let found = client.get::<herd_core::kinds::MemberSpec>(member).await?;
            found.spec.node.with_context(|| format!("member {member} is not placed on a node yet"))?
        }
        _ => first.to_string(),
    };
    let mut chunk = client.member_log(&node, member, stream, bytes, None).await?;
    write_out(&chunk.bytes)?;
    if !follow {
        return Ok(());
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let next = chunk.end();
        chunk = client.member_log(&node, member, stream, FOLLOW_CHUNK, Some(next)).await?;
        if chunk.offset < next {
            eprintln!("herd: the {stream} log of {member} started again (it is shorter than before)");
        } else if chunk.offset > next {
            let lost = chunk.offset - next;
            eprintln!("herd: {lost} bytes of the {stream} log of {member} were rotated away before they were read");
        }
        write_out(&chunk.bytes)?;
    }
}
