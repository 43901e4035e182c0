//! The rustls configuration of the HTTPS clients: the OTLP exporter's (a CA file or the system's
//! roots, optionally a client certificate) and `gpu-tracer cost --prometheus`'s.
use crate::config::otlp::OtlpTls;

/// The rustls configuration of an HTTP client: for `https`, trusting the PEM CA certificate(s)
/// `ca_pem`, else the system's roots (`gpu-tracer cost --prometheus` uses it too).
pub fn http_client_tls(ca_pem: Option<&[u8]>, https: bool) -> Result<rustls::ClientConfig, String> {
    let tls = https.then(|| OtlpTls { ca_pem: ca_pem.map(<[u8]>::to_vec), identity: None });
    http_tls(tls.as_ref())
}

/// The rustls client configuration of the HTTP transport (also used for `http://`, where it is
/// never consulted).
pub fn http_tls(tls: Option<&OtlpTls>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let mut roots = rustls::RootCertStore::empty();
    match tls.and_then(|t| t.ca_pem.as_deref()) {
        Some(pem) => {
            for c in CertificateDer::pem_slice_iter(pem) {
                roots.add(c.map_err(|e| format!("the CA file: {e}"))?).map_err(|e| format!("the CA file: {e}"))?;
            }
            if roots.is_empty() {
                return Err("the CA file holds no certificate".into());
            }
        }
        None if tls.is_some() => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(
                    "this system has no CA certificates; set otlp.certificate (OTEL_EXPORTER_OTLP_CERTIFICATE) \
                            to the PEM file of the CA that signed the collector's certificate"
                        .into(),
                );
            }
        }
        None => {}
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
    match tls.and_then(|t| t.identity.as_ref()) {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("the client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("the client key: {e}"))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("the client certificate and key: {e}"))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}
