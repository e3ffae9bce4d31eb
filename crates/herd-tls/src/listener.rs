//! A TLS listener for `axum::serve`: TCP connections are accepted and their
//! handshakes run concurrently (a slow or failing client holds up no one),
//! and only finished TLS streams are handed to the server. Its
//! configuration may come later and change (an agent's endpoint binds
//! before its certificate arrives, and renews it): until there is one,
//! connections are closed at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: rustls::ServerConfig) -> std::io::Result<TlsListener> {
        let (_, current) = watch::channel(Some(Arc::new(config)));
        TlsListener::changing(tcp, current)
    }

    /// Serves with the configuration `current` holds at each connection.
    pub fn changing(
        tcp: TcpListener,
        current: watch::Receiver<Option<Arc<rustls::ServerConfig>>>,
    ) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (send, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let Some(config) = current.borrow().clone() else {
                    tracing::debug!(%peer, "no certificate to serve yet: connection closed");
                    continue;
                };
                let (acceptor, send) = (TlsAcceptor::from(config), send.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = send.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, ready, accepting })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task never ends on its own; if it is gone, so is serving.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
