//! A TLS-terminating proxy in front of a node, with the self-signed
//! certificate in `tests/fixtures/tls` (for 127.0.0.1 and localhost): what
//! an operator puts in front of muster to serve `https://`.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificate the proxy presents, PEM (a client trusts it with
/// `add_root_certificate_pem`).
pub fn test_cert_pem() -> Vec<u8> {
    std::fs::read(fixture("cert.pem")).expect("tests/fixtures/tls/cert.pem")
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// Accepts TLS on a free loopback port and pipes the plain bytes to the
/// target port; stops when dropped.
pub struct TlsProxy {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    pub async fn start(target_port: u16) -> TlsProxy {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(fixture("cert.pem"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(fixture("key.pem")).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here.
                    let Ok(mut tls) = acceptor.accept(inbound).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(("127.0.0.1", target_port)).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsProxy { port, task }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
