//! TLS for every port (rustls on the ring backend): the server configs of
//! the protocol port (mTLS when a client CA is given) and the admin port,
//! and the client config of this node's own connections to its peer and
//! primary. A leaf: it knows files and sockets, no layer of the server.
//!
//! ```text
//!  files (cert, key, client CA, CA) --load/reload--> Configs (ArcSwap)
//!      protocol: ServerConfig (client cert required under mTLS)
//!      admin:    ServerConfig (no client cert: probes hold none)
//!      outgoing: ClientConfig (verifies the other node against the CA;
//!                presents this node's cert when asked, for mTLS)
//!  accept / connect --> Socket (socket.rs): plain TCP or TLS, one type
//! ```
//!
//! Invariants:
//! - a reload builds every config from the files first and swaps them in
//!   whole, or changes nothing (a half-written or mismatched file leaves
//!   the old certificate in force);
//! - each handshake takes the configs in force when it starts: open
//!   connections keep the certificate they were made with, new ones get
//!   the new one;
//! - only TLS 1.2 and 1.3 with rustls' safe defaults.

mod socket;

pub use socket::Socket;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Where the TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// CA that client certificates must chain to (mTLS on the protocol
    /// port).
    pub client_ca: Option<PathBuf>,
    /// CA the other nodes' certificates must chain to.
    pub ca: Option<PathBuf>,
}

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("{path}: no certificate in it")]
    NoCertificate { path: PathBuf },
    #[error("{cert} and {key}: {reason}")]
    KeyPair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("{path}: not a usable CA: {reason}")]
    Ca { path: PathBuf, reason: String },
}

/// Every config built from one reading of the files.
struct Configs {
    protocol: Arc<ServerConfig>,
    admin: Arc<ServerConfig>,
    outgoing: Option<Arc<ClientConfig>>,
}

/// The TLS state of a server: the configs in force, reloadable.
pub struct Tls {
    paths: TlsPaths,
    configs: ArcSwap<Configs>,
    /// What the files looked like when last loaded (size and mtime), to
    /// notice a change without reading them.
    stamps: Mutex<Vec<Stamp>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("paths", &self.paths).finish()
    }
}

type Stamp = Option<(u64, SystemTime)>;

impl Tls {
    /// Reads the files and builds every config; an unusable file is the
    /// error, naming it.
    pub fn load(paths: TlsPaths) -> Result<Self, TlsError> {
        let stamps = stamps(&paths);
        let configs = build(&paths)?;
        Ok(Self {
            paths,
            configs: ArcSwap::from_pointee(configs),
            stamps: Mutex::new(stamps),
        })
    }

    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    /// Reads the files again and swaps the new configs in; on an error the
    /// configs in force stay. Either way the files as read are remembered,
    /// so a broken file is tried again only once it changes.
    pub fn reload(&self) -> Result<(), TlsError> {
        *self.stamps.lock() = stamps(&self.paths);
        let configs = build(&self.paths)?;
        self.configs.store(Arc::new(configs));
        Ok(())
    }

    /// Whether a file changed (size or mtime) since the last load.
    pub fn changed_on_disk(&self) -> bool {
        *self.stamps.lock() != stamps(&self.paths)
    }

    /// Accepts TLS on the protocol port (client certificate required when
    /// a client CA is set).
    pub fn protocol_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.configs.load().protocol.clone())
    }

    /// Accepts TLS on the admin port (no client certificate).
    pub fn admin_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.configs.load().admin.clone())
    }

    /// Connects to another node (None without a CA to verify it by).
    pub fn connector(&self) -> Option<TlsConnector> {
        self.configs.load().outgoing.clone().map(TlsConnector::from)
    }
}

/// Connects to `addr` (host:port) within `timeout`: TLS verified against
/// the connector's CA when one is given (the host part is the name the
/// certificate must carry), plain TCP otherwise.
pub async fn connect(
    addr: &str,
    connector: Option<&TlsConnector>,
    timeout: Duration,
) -> std::io::Result<Socket> {
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out())??;
    stream.set_nodelay(true)?;
    let Some(connector) = connector else {
        return Ok(Socket::Plain(stream));
    };
    let name = server_name(addr)?;
    let tls = tokio::time::timeout(timeout, connector.connect(name, stream))
        .await
        .map_err(|_| timed_out())??;
    Ok(Socket::from(tls))
}

/// The name a node's certificate must carry: the host part of `host:port`
/// (a DNS name, or an IP address).
fn server_name(addr: &str) -> std::io::Result<ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((host, _)) => host,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr}: no name to verify a certificate by: {e}"),
        )
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(paths: &TlsPaths) -> Result<Configs, TlsError> {
    let chain = certificates(&paths.cert)?;
    let key = private_key(&paths.key)?;
    let pair_error = |e: rustls::Error| TlsError::KeyPair {
        cert: paths.cert.clone(),
        key: paths.key.clone(),
        reason: e.to_string(),
    };
    let versions = |p| {
        ServerConfig::builder_with_provider(p)
            .with_safe_default_protocol_versions()
            .map_err(pair_error)
    };
    let protocol = match &paths.client_ca {
        Some(ca) => {
            let roots = roots(ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| TlsError::Ca {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            versions(provider())?.with_client_cert_verifier(verifier)
        }
        None => versions(provider())?.with_no_client_auth(),
    }
    .with_single_cert(chain.clone(), key.clone_key())
    .map_err(pair_error)?;
    let admin = versions(provider())?
        .with_no_client_auth()
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(pair_error)?;
    let outgoing = match &paths.ca {
        Some(ca) => Some(Arc::new(
            ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(pair_error)?
                .with_root_certificates(roots(ca)?)
                .with_client_auth_cert(chain, key)
                .map_err(pair_error)?,
        )),
        None => None,
    };
    Ok(Configs {
        protocol: Arc::new(protocol),
        admin: Arc::new(admin),
        outgoing,
    })
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate of a PEM file, in order.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        reason: format!("no usable private key: {e}"),
    })
}

/// A root store of the certificates in a PEM file.
pub fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certificates(path)? {
        store.add(cert).map_err(|e| TlsError::Ca {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(store))
}

/// A client config that trusts `ca` (the CLI's and tests' side of TLS).
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Ca {
            path: ca.to_owned(),
            reason: e.to_string(),
        })?
        .with_root_certificates(roots(ca)?)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn stamps(paths: &TlsPaths) -> Vec<Stamp> {
    [
        Some(&paths.cert),
        Some(&paths.key),
        paths.client_ca.as_ref(),
        paths.ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        let meta = std::fs::metadata(p).ok()?;
        Some((meta.len(), meta.modified().ok()?))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::server_name;

    #[test]
    fn the_name_to_verify_is_the_host_part() {
        assert_eq!(
            server_name("node-a.internal:7700").unwrap(),
            rustls_pki_types::ServerName::try_from("node-a.internal").unwrap()
        );
        assert!(matches!(
            server_name("127.0.0.1:7700").unwrap(),
            rustls_pki_types::ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:7700").unwrap(),
            rustls_pki_types::ServerName::IpAddress(_)
        ));
        assert!(server_name("bad name:1").is_err());
    }
}
