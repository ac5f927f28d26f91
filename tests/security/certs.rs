//! Certificates made for the tests with rcgen: a root CA, an intermediate,
//! and leaves they sign (for 127.0.0.1 and localhost, usable as server and
//! client certificates, like a node's), valid or expired; and TLS client
//! configs built from them with rustls directly.

use crate::common::{RawConn, PATIENCE};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tollgate::tls::Socket;

/// A certificate authority.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
}

/// A certificate and its key, as PEM; `chain` holds the leaf then any
/// intermediate.
pub struct Leaf {
    pub chain: String,
    pub key: String,
    /// The leaf alone, DER (to tell which certificate a server presented).
    pub der: Vec<u8>,
}

/// When a leaf is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    Now,
    /// Expired years ago.
    Expired,
}

impl Ca {
    /// A self-signed root.
    pub fn root(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let cert = ca_params(name).self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let cert = ca_params(name)
            .signed_by(&key, &self.cert, &self.key)
            .unwrap();
        Self { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf for 127.0.0.1 and localhost, named `name`, for server and
    /// client use.
    pub fn issue(&self, name: &str, validity: Validity) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if validity == Validity::Expired {
            params.not_before = rcgen::date_time_ymd(2015, 1, 1);
            params.not_after = rcgen::date_time_ymd(2016, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            chain: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// Like [`issue`](Self::issue), the chain carrying this intermediate.
    pub fn issue_chained(&self, name: &str) -> Leaf {
        let mut leaf = self.issue(name, Validity::Now);
        leaf.chain.push_str(&self.pem());
        leaf
    }
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// Where a leaf's files are.
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Leaf {
    /// Writes the chain and the key as `<name>.crt` and `<name>.key` in
    /// `dir`, each a new file renamed over the old (as a renewal tool
    /// would).
    pub fn write(&self, dir: &Path, name: &str) -> Files {
        let files = Files {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        crate::common::write_atomically(&files.key, &self.key);
        crate::common::write_atomically(&files.cert, &self.chain);
        files
    }
}

/// Writes `pem` (a CA) to `dir/name` and returns the path.
pub fn write_ca(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path
}

/// A TLS client config trusting `ca` (PEM), presenting `client` when given.
pub fn client_config(ca: &str, client: Option<&Leaf>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let config = match client {
        Some(leaf) => {
            let chain = CertificateDer::pem_slice_iter(leaf.chain.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// A TLS connection to `addr` as 127.0.0.1, and the certificate the server
/// presented (DER); the handshake's error when it fails on the client's
/// side.
pub async fn tls_connect(
    addr: &str,
    config: Arc<ClientConfig>,
) -> Result<(RawConn, Vec<u8>), std::io::Error> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio::time::timeout(PATIENCE, TlsConnector::from(config).connect(name, tcp))
        .await
        .expect("the handshake ends in time")?;
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    Ok((RawConn::over(Socket::from(tls)), presented))
}
