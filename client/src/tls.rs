//! TLS to the nodes (rustls on the ring backend): the name a node's
//! certificate must carry, and a config that trusts one CA file, for
//! [`ClientConfig::tls`](crate::ClientConfig::tls).
//!
//! Invariants: only TLS 1.2 and 1.3 with rustls' safe defaults; a node is
//! verified against the host part of the address it is reached by, so a
//! redirection (MOVED, TOPOLOGY) to an address its certificate does not
//! name fails the handshake rather than trusting it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

pub use rustls;

/// Why a CA file cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the CA file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Ca { path: PathBuf, reason: String },
}

/// A config that verifies nodes against the CA certificates in `ca` (PEM),
/// presenting no client certificate.
pub fn tls_trusting(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let bad = |reason: String| TlsError::Ca {
        path: ca.to_owned(),
        reason,
    };
    let pem = std::fs::read(ca).map_err(|source| TlsError::Read {
        path: ca.to_owned(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("not a PEM certificate: {e}")))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name a node's certificate must carry: the host part of `host:port`
/// (a DNS name, or an IP address, IPv6 in brackets).
pub fn server_name(addr: &str) -> std::io::Result<ServerName<'static>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_the_host_part() {
        assert_eq!(
            server_name("gw.example:7700").unwrap(),
            ServerName::try_from("gw.example").unwrap()
        );
        assert_eq!(
            server_name("[::1]:7700").unwrap(),
            ServerName::try_from("::1").unwrap()
        );
        assert!(server_name("bad name:1").is_err());
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let path = std::env::temp_dir().join(format!("tollgate-empty-ca-{}", std::process::id()));
        std::fs::write(&path, "not pem").unwrap();
        let e = tls_trusting(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(e.to_string().contains("no certificate"), "{e}");
    }
}
