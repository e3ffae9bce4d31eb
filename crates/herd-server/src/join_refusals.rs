//! [`JoinRefusals`]: joins refused for their token, counted and limited
//! per source address. Nothing of such a request is stored: its body was
//! sent by someone who showed no valid token. Each source may be refused
//! a burst of joins, then one a second; beyond that its joins are answered
//! 429 without looking at the token, until its bucket fills again. The
//! operator sees them in `herd_join_refusals_total` and in the log (once
//! per burst, with the source address), not as Events.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use herd_core::throttle::{Bucket, Rate};

use crate::error::ApiError;

/// Refused joins one source may make at once, then one more a second: an
/// agent given a wrong token stops at its first refusal, a mistyped
/// command is retried by hand a few times.
pub const RATE: Rate = Rate { burst: 10, every: Duration::from_secs(1) };

/// Sources remembered at most; past it, those whose buckets are full again
/// are forgotten first, then all.
const MAX_SOURCES: usize = 4096;

/// The address a request came from, as the connection says (never from
/// its headers or body).
#[derive(Clone, Copy, Debug)]
pub struct RemoteAddr(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, herd_tls::listener::TlsListener>>
    for RemoteAddr
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, herd_tls::listener::TlsListener>) -> Self {
        RemoteAddr(*stream.remote_addr())
    }
}

/// The plain-HTTP listener (`insecure_http`). Nagle is off: without it, a
/// response written in two parts waits for the peer's delayed
/// acknowledgement (40 ms on Linux).
pub struct PlainListener(pub tokio::net::TcpListener);

impl axum::serve::Listener for PlainListener {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = axum::serve::Listener::accept(&mut self.0).await;
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        (stream, addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, PlainListener>> for RemoteAddr {
    fn connect_info(stream: axum::serve::IncomingStream<'_, PlainListener>) -> Self {
        RemoteAddr(*stream.remote_addr())
    }
}

#[derive(Default)]
pub struct JoinRefusals {
    sources: Mutex<HashMap<IpAddr, Bucket>>,
}

impl JoinRefusals {
    /// Whether a join from `source` is looked at: 429 while its refused
    /// joins are over the rate.
    pub fn admit(&self, source: IpAddr) -> Result<(), ApiError> {
        let now = Instant::now();
        let Ok(mut sources) = self.sources.lock() else { return Ok(()) };
        let Some(bucket) = sources.get_mut(&source) else { return Ok(()) };
        if bucket.allows(RATE, now) {
            return Ok(());
        }
        let wait = bucket.wait(RATE, now).as_secs().max(1);
        Err(ApiError::TooManyRequests(format!(
            "too many joins with a token that is not valid came from {source}: try again in {wait}s"
        )))
    }

    /// Notes a join from `source` refused for its token.
    pub fn refused(&self, source: IpAddr, error: &ApiError) {
        let now = Instant::now();
        let Ok(mut sources) = self.sources.lock() else { return };
        if sources.len() >= MAX_SOURCES && !sources.contains_key(&source) {
            sources.retain(|_, bucket| !bucket.is_full(RATE, now));
            if sources.len() >= MAX_SOURCES {
                sources.clear();
            }
        }
        let bucket = sources.entry(source).or_insert_with(|| Bucket::full(RATE, now));
        if bucket.is_full(RATE, now) {
            tracing::warn!(%source, %error, "a join was refused for its token (more from there are only counted)");
        }
        bucket.take(RATE, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_limited_alone() {
        let refusals = JoinRefusals::default();
        let (flooding, other): (IpAddr, IpAddr) = ("127.0.0.7".parse().unwrap(), "127.0.0.8".parse().unwrap());
        let error = ApiError::Unauthorized("the join token is not valid".into());
        for _ in 0..RATE.burst {
            refusals.admit(flooding).unwrap();
            refusals.refused(flooding, &error);
        }
        let limited = refusals.admit(flooding).unwrap_err();
        assert!(matches!(limited, ApiError::TooManyRequests(_)), "{limited}");
        assert!(limited.to_string().contains("127.0.0.7"), "{limited}");
        refusals.admit(other).expect("another source is not limited");
    }
}
