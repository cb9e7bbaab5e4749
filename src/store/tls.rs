//! TLS for PostgreSQL connections: the connector that carries out a URL's `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey` (parsed in `src/pg_url.rs`). TLS is rustls with the
//! ring provider.

pub use crate::pg_url::{PgTls, RootCerts, SslMode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

impl PgTls {
    /// The connector for tokio-postgres (used for every mode but `disable`). Reads the
    /// certificate files now, so a missing or bad one is an error at start-up that names it.
    pub fn connector(&self) -> Result<MakeRustlsConnect, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up failed: {e}"))?;
        let mode = self.effective_mode();
        let chain = match mode {
            SslMode::Disable | SslMode::Prefer | SslMode::Require => None,
            SslMode::VerifyCa | SslMode::VerifyFull => Some(
                WebPkiServerVerifier::builder_with_provider(
                    Arc::new(self.roots()?),
                    provider.clone(),
                )
                .build()
                .map_err(|e| format!("TLS set-up failed: {e}"))?,
            ),
        };
        let verifier = Arc::new(Verifier {
            chain,
            check_name: mode == SslMode::VerifyFull,
            algorithms: provider.signature_verification_algorithms,
        });
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let certs = read_certs(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!(
                        "sslkey {}: {e}; it must be a readable PEM private key (PKCS#8, PKCS#1 \
                         or SEC1), unencrypted",
                        key.display()
                    )
                })?;
                builder.with_client_auth_cert(certs, key).map_err(|e| {
                    format!(
                        "sslcert {} and sslkey do not make a usable client identity: {e}",
                        cert.display()
                    )
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(MakeRustlsConnect::new(config))
    }

    fn roots(&self) -> Result<RootCertStore, String> {
        let mut roots = RootCertStore::empty();
        match &self.root {
            Some(RootCerts::File(path)) => {
                for cert in read_certs(path, "sslrootcert")? {
                    roots.add(cert).map_err(|e| {
                        format!(
                            "sslrootcert {}: not a usable CA certificate: {e}",
                            path.display()
                        )
                    })?;
                }
            }
            Some(RootCerts::System) | None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(format!(
                        "sslmode={} trusts the system's CA store when no sslrootcert is given, \
                         and none was found ({}); install CA certificates or give \
                         sslrootcert=<CA file>",
                        self.mode.as_str(),
                        found
                            .errors
                            .first()
                            .map(|e| e.to_string())
                            .unwrap_or_else(|| "no certificates".into())
                    ));
                }
            }
        }
        Ok(roots)
    }
}

fn read_certs(path: &std::path::Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |e: String| format!("{what} {}: {e}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("{e}; give a readable PEM file")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("{e}; give a PEM file")))?;
    if certs.is_empty() {
        return Err(bad(
            "holds no certificate (expected -----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(certs)
}

/// How a mode checks the server's certificate: `prefer`/`require` not at all (libpq's
/// meaning: encrypted, unauthenticated), `verify-ca` the chain, `verify-full` the chain and
/// the name. The handshake's signatures are verified in every mode, so the session key is
/// the certificate holder's.
#[derive(Debug)]
struct Verifier {
    /// The chain check; none for `prefer`/`require`.
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The chain is checked before the name: a name error means the chain was good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ca_file_is_named_when_the_connector_is_built() {
        let tls =
            PgTls::split("postgres://db/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
                .unwrap()
                .1;
        let err = tls.connector().err().unwrap();
        assert!(err.contains("sslrootcert /nonexistent/ca.pem"), "{err}");
    }
}
