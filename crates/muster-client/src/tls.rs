//! TLS for `https://` nodes: rustls with the platform's trust store and the
//! roots the builder adds. One config serves reqwest and the events
//! WebSocket, so both trust the same certificates.

use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::error::{Error, Result};

/// The platform's roots, read once per process (a few hundred files).
fn native_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if !found.errors.is_empty() {
            tracing::debug!(
                errors = found.errors.len(),
                "some platform root certificates could not be read"
            );
        }
        found.certs
    })
}

/// The client's TLS settings: the process's default crypto provider when
/// one is installed (the server installs aws-lc-rs), else ring.
pub(crate) fn config(extra_pem: &[Vec<u8>]) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = RootCertStore::empty();
    // A platform certificate rustls cannot use is skipped, as curl does.
    let _ = roots.add_parsable_certificates(native_roots().iter().cloned());
    for (i, pem) in extra_pem.iter().enumerate() {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| Error::Invalid(format!("root certificate {}: not PEM: {e}", i + 1)))?;
            roots
                .add(cert)
                .map_err(|e| Error::Invalid(format!("root certificate {}: {e}", i + 1)))?;
            added += 1;
        }
        if added == 0 {
            return Err(Error::Invalid(format!(
                "root certificate {}: no `BEGIN CERTIFICATE` block in it",
                i + 1
            )));
        }
    }
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Invalid(format!("cannot set up TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::config;

    /// This crate turns on reqwest's rustls: every other reqwest client in
    /// the process (the application's own) must still build when nobody
    /// installed a rustls provider. With reqwest's `-no-provider` feature it
    /// panicked ("No provider set"), and so did the test suite's clients.
    #[test]
    fn other_reqwest_clients_in_the_process_still_build() {
        assert!(rustls::crypto::CryptoProvider::get_default().is_none());
        reqwest::Client::builder().build().unwrap();
    }

    #[test]
    fn an_added_root_must_be_a_pem_certificate() {
        assert!(config(&[]).is_ok());
        let err = config(&[b"not a certificate".to_vec()]).unwrap_err().to_string();
        assert!(
            err.contains("root certificate 1") && err.contains("BEGIN CERTIFICATE"),
            "{err}"
        );
    }
}
