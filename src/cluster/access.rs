//! Who a node (or the CLI) is to etcd: TLS on etcd's client port (the CA
//! that signed etcd's certificate, and a client certificate when etcd
//! demands one, `--client-cert-auth`), and etcd's own users (a name and a
//! password, when etcd runs with `auth enable`).
//!
//! Invariants, checked by [`EtcdAccess::validate`] before anything is
//! sent: a client certificate comes with its key and over TLS; a user comes
//! with exactly one password (given, or read from a file) and a password
//! with a user; TLS needs a CA (this binary carries no system roots). The
//! files are read when connecting, each failure naming its file.

use std::path::{Path, PathBuf};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How to authenticate to etcd. No field set: plain HTTP, no user.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// PEM CA certificate(s) etcd's certificate must chain to; set: TLS.
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate (chain) presented to etcd, with its key.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// etcd user name.
    pub user: Option<String>,
    /// The user's password, given...
    pub password: Option<String>,
    /// ...or read from this file (its first line).
    pub password_file: Option<PathBuf>,
}

/// The password never reaches a log through `{:?}`.
impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls_ca", &self.tls_ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_file", &self.password_file)
            .finish()
    }
}

/// Why the etcd credentials cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EtcdAccessError {
    #[error(
        "--etcd-cert needs --etcd-key: a client certificate is presented with its private key"
    )]
    CertWithoutKey,
    #[error("--etcd-key needs --etcd-cert")]
    KeyWithoutCert,
    #[error("--etcd-cert needs --etcd-tls-ca: a client certificate is only presented over TLS")]
    CertWithoutTls,
    #[error("--etcd-user needs a password: --etcd-password, TOLLGATE_ETCD_PASSWORD or --etcd-password-file")]
    UserWithoutPassword,
    #[error("an etcd password needs --etcd-user")]
    PasswordWithoutUser,
    #[error("give the etcd password once: --etcd-password (TOLLGATE_ETCD_PASSWORD) or --etcd-password-file")]
    TwoPasswords,
    #[error("etcd endpoint {endpoint}: https needs --etcd-tls-ca, the CA that signed etcd's certificate")]
    HttpsWithoutCa { endpoint: String },
    #[error("etcd endpoint {endpoint} is plain http but --etcd-tls-ca asks for TLS: write https://HOST:PORT or HOST:PORT")]
    HttpWithTls { endpoint: String },
    #[error("cannot read the {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} {path} holds no PEM {expected}")]
    NoPem {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("the etcd password file {path} is empty")]
    EmptyPassword { path: PathBuf },
}

impl EtcdAccess {
    /// Whether etcd is reached over TLS.
    pub fn tls(&self) -> bool {
        self.tls_ca.is_some()
    }

    /// Checks the combination (no file is read), and that `urls` (full
    /// URLs, see `EtcdSettings::urls`) agree with TLS being on or off.
    pub fn validate(&self, urls: &[String]) -> Result<(), EtcdAccessError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => return Err(EtcdAccessError::CertWithoutKey),
            (None, Some(_)) => return Err(EtcdAccessError::KeyWithoutCert),
            (Some(_), Some(_)) if !self.tls() => return Err(EtcdAccessError::CertWithoutTls),
            _ => {}
        }
        let passwords =
            usize::from(self.password.is_some()) + usize::from(self.password_file.is_some());
        match (self.user.is_some(), passwords) {
            (_, 2) => return Err(EtcdAccessError::TwoPasswords),
            (true, 0) => return Err(EtcdAccessError::UserWithoutPassword),
            (false, 1) => return Err(EtcdAccessError::PasswordWithoutUser),
            _ => {}
        }
        for url in urls {
            let endpoint = url.clone();
            match (url.starts_with("https://"), self.tls()) {
                (true, false) => return Err(EtcdAccessError::HttpsWithoutCa { endpoint }),
                (false, true) => return Err(EtcdAccessError::HttpWithTls { endpoint }),
                _ => {}
            }
        }
        Ok(())
    }

    /// Adds TLS and the user to `options`, reading the files.
    pub(crate) fn apply(
        &self,
        mut options: ConnectOptions,
    ) -> Result<ConnectOptions, EtcdAccessError> {
        if let Some(ca) = &self.tls_ca {
            let ca = read_certs(ca, "etcd CA file (--etcd-tls-ca)")?;
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                let cert = read_certs(cert, "etcd client certificate (--etcd-cert)")?;
                let key = read_key(key)?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        if let Some(user) = &self.user {
            let password = self.password()?;
            // etcd's tokens expire (5 min for its simple tokens): ask for a
            // new one when a request is refused for an expired token.
            options = options
                .with_user(user.clone(), password)
                .with_auto_token_refresh(true);
        }
        Ok(options)
    }

    /// The password, given or read from its file (trailing newline off).
    fn password(&self) -> Result<String, EtcdAccessError> {
        if let Some(p) = &self.password {
            return Ok(p.clone());
        }
        let Some(path) = &self.password_file else {
            return Ok(String::new());
        };
        let text = std::fs::read_to_string(path).map_err(|source| EtcdAccessError::Read {
            what: "etcd password file",
            path: path.clone(),
            source,
        })?;
        let password = text.lines().next().unwrap_or_default();
        if password.is_empty() {
            return Err(EtcdAccessError::EmptyPassword { path: path.clone() });
        }
        Ok(password.to_owned())
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, EtcdAccessError> {
    std::fs::read(path).map_err(|source| EtcdAccessError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The file's bytes, once it is known to hold at least one certificate
/// (tonic would only say "tls error" at the first request).
fn read_certs(path: &Path, what: &'static str) -> Result<Vec<u8>, EtcdAccessError> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .filter(Result::is_ok)
        .count();
    if certs == 0 {
        return Err(EtcdAccessError::NoPem {
            what,
            path: path.to_owned(),
            expected: "certificate",
        });
    }
    Ok(pem)
}

fn read_key(path: &Path) -> Result<Vec<u8>, EtcdAccessError> {
    let what = "etcd client key (--etcd-key)";
    let pem = read(path, what)?;
    if PrivateKeyDer::from_pem_slice(&pem).is_err() {
        return Err(EtcdAccessError::NoPem {
            what,
            path: path.to_owned(),
            expected: "private key",
        });
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(tls: bool) -> Vec<String> {
        let scheme = if tls { "https" } else { "http" };
        vec![format!("{scheme}://127.0.0.1:2379")]
    }

    #[test]
    fn bad_combinations_are_named() {
        let none = EtcdAccess::default();
        none.validate(&urls(false)).unwrap();
        let tls = EtcdAccess {
            tls_ca: Some("ca.pem".into()),
            ..EtcdAccess::default()
        };
        tls.validate(&urls(true)).unwrap();
        let cert = EtcdAccess {
            cert: Some("c.pem".into()),
            ..tls.clone()
        };
        let check = |a: &EtcdAccess, tls_urls: bool| a.validate(&urls(tls_urls)).unwrap_err();
        assert!(matches!(
            check(&cert, true),
            EtcdAccessError::CertWithoutKey
        ));
        let key = EtcdAccess {
            key: Some("k.pem".into()),
            ..tls.clone()
        };
        assert!(matches!(check(&key, true), EtcdAccessError::KeyWithoutCert));
        let plain_cert = EtcdAccess {
            tls_ca: None,
            key: Some("k.pem".into()),
            ..cert
        };
        assert!(matches!(
            check(&plain_cert, false),
            EtcdAccessError::CertWithoutTls
        ));
        assert!(matches!(
            check(&none, true),
            EtcdAccessError::HttpsWithoutCa { .. }
        ));
        assert!(matches!(
            check(&tls, false),
            EtcdAccessError::HttpWithTls { .. }
        ));
        let user = EtcdAccess {
            user: Some("root".into()),
            ..EtcdAccess::default()
        };
        assert!(matches!(
            check(&user, false),
            EtcdAccessError::UserWithoutPassword
        ));
        let password = EtcdAccess {
            password: Some("pw".into()),
            ..EtcdAccess::default()
        };
        assert!(matches!(
            check(&password, false),
            EtcdAccessError::PasswordWithoutUser
        ));
        let both = EtcdAccess {
            user: Some("root".into()),
            password_file: Some("pw.txt".into()),
            ..password.clone()
        };
        assert!(matches!(check(&both, false), EtcdAccessError::TwoPasswords));
        let debug = format!("{:?}", both);
        assert!(!debug.contains("\"pw\""), "{debug}");
    }
}
