//! Optional TLS for grpo's gRPC traffic (a worker's service, the learner's
//! registry): the server's certificate and key, and what a caller trusts.
//!
//! Without TLS, calls (the shared token and the weights among them) travel
//! as plain HTTP/2, fine on loopback or a private network. A server given
//! [`ServerTls`] accepts TLS only. A caller dials `https://` addresses over
//! TLS, trusting [`ClientTls`]'s CA file, or the system's roots when it has
//! none; an address without a scheme is `https://` when a CA file is given
//! and `http://` otherwise. The certificate must name the host the caller
//! dials (a DNS name or an IP address in its subject alternative names).

use std::path::{Path, PathBuf};

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

use crate::error::WorkerError;

/// A server's TLS identity: its certificate chain and private key (PEM).
#[derive(Clone)]
pub struct ServerTls {
    config: ServerTlsConfig,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls { .. }") // never the key
    }
}

impl ServerTls {
    /// Reads the certificate chain and private key PEM files, checking that
    /// both parse and belong together.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<ServerTls, WorkerError> {
        let (cert_pem, key_pem) = (read(cert)?, read(key)?);
        certificates(cert, &cert_pem)?;
        let config = ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
        // Building a server builds its acceptor: a bad key or a key of
        // another certificate is refused here, not at the first call.
        Server::builder()
            .tls_config(config.clone())
            .map_err(|source| WorkerError::Tls {
                path: key.to_path_buf(),
                message: format!("the key does not go with the certificate {}: {source}", cert.display()),
            })?;
        Ok(ServerTls { config })
    }
}

/// A server builder: serving TLS with `tls` when given, else plain HTTP/2.
pub(crate) fn server_builder(tls: Option<&ServerTls>) -> Result<Server, WorkerError> {
    match tls {
        Some(tls) => Server::builder()
            .tls_config(tls.config.clone())
            .map_err(WorkerError::Serve),
        None => Ok(Server::builder()),
    }
}

/// What a caller trusts: a CA file's certificates, or the system's roots.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    ca: Option<Certificate>,
}

impl ClientTls {
    /// Trusts the certificates of a CA PEM file (and only those).
    pub fn from_ca_file(path: &Path) -> Result<ClientTls, WorkerError> {
        let pem = read(path)?;
        certificates(path, &pem)?;
        Ok(ClientTls {
            ca: Some(Certificate::from_pem(pem)),
        })
    }

    /// `endpoint` (`host:port` or a URL) as a tonic endpoint, over TLS when
    /// its scheme is `https` (the default scheme when a CA file is given).
    pub(crate) fn endpoint(&self, endpoint: &str) -> Result<Endpoint, WorkerError> {
        let uri = with_scheme(endpoint, self.ca.is_some());
        let connect_error = |source| WorkerError::Connect {
            endpoint: endpoint.to_string(),
            source,
        };
        let parsed = Endpoint::from_shared(uri.clone()).map_err(connect_error)?;
        if !uri.starts_with("https://") {
            return Ok(parsed);
        }
        let config = match &self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(ca.clone()),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        parsed.tls_config(config).map_err(connect_error)
    }
}

/// `endpoint` with a scheme: its own, else `https` or `http`.
fn with_scheme(endpoint: &str, https: bool) -> String {
    match (endpoint.contains("://"), https) {
        (true, _) => endpoint.to_string(),
        (false, true) => format!("https://{endpoint}"),
        (false, false) => format!("http://{endpoint}"),
    }
}

/// Whether `address` (`host:port` or a URL) is one a caller can dial.
pub(crate) fn is_dialable(address: &str) -> bool {
    Endpoint::from_shared(with_scheme(address, false)).is_ok()
}

fn read(path: &Path) -> Result<Vec<u8>, WorkerError> {
    std::fs::read(path).map_err(|e| WorkerError::Tls {
        path: PathBuf::from(path),
        message: format!("cannot read it: {e}"),
    })
}

/// Checks that `pem` holds at least one certificate and nothing unreadable.
fn certificates(path: &Path, pem: &[u8]) -> Result<(), WorkerError> {
    let tls_error = |message: String| WorkerError::Tls {
        path: PathBuf::from(path),
        message,
    };
    let count = CertificateDer::pem_slice_iter(pem)
        .try_fold(0usize, |n, cert| cert.map(|_| n + 1))
        .map_err(|e| tls_error(format!("not a PEM certificate file: {e}")))?;
    if count == 0 {
        return Err(tls_error(
            "holds no certificate (no `-----BEGIN CERTIFICATE-----` block)".to_string(),
        ));
    }
    Ok(())
}
