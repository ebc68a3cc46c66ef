//! `--cacert` as curl reads it: the server's certificate is trusted when
//! OpenSSL (curl's TLS library) verifies it against the file's
//! certificates, and when it names the host as curl's own check does.
//!
//! rustls alone refuses a certificate that is a CA (`CA:TRUE`) served as
//! the server's own (`CaUsedAsEndEntity`), which is what
//! `openssl req -x509` makes; curl accepts it when the file holds it. Here
//! rustls runs the handshake and checks its signatures; the certificate
//! is OpenSSL's to judge: the chain up to one of the file's certificates,
//! each within its validity, and the name. Everything else (no
//! `--cacert`) is reqwest's own verifier.

use std::net::IpAddr;
use std::sync::Arc;

use openssl::stack::Stack;
use openssl::x509::store::{X509Store, X509StoreBuilder};
use openssl::x509::{X509PurposeId, X509StoreContext, X509};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

/// The client TLS configuration trusting `pem`'s certificates as curl
/// does.
pub(super) fn config(pem: &[u8]) -> Result<rustls::ClientConfig, String> {
    let certs = X509::stack_from_pem(pem).map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no certificate in it".into());
    }
    let mut store = X509StoreBuilder::new().map_err(|e| e.to_string())?;
    // What OpenSSL checks for a TLS client by default ("ssl_server").
    store
        .set_purpose(X509PurposeId::SSL_SERVER)
        .map_err(|e| e.to_string())?;
    for cert in certs {
        store.add_cert(cert).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = Arc::new(CurlTrust {
        store: store.build(),
        provider: provider.clone(),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(config)
}

struct CurlTrust {
    store: X509Store,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for CurlTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CurlTrust")
    }
}

/// A certificate refused: reqwest's error text says "certificate", which
/// `call` reads as curl's exit 60.
fn refused(why: String) -> Error {
    Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        std::io::Error::other(why),
    ))))
}

impl ServerCertVerifier for CurlTrust {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let der = |c: &CertificateDer<'_>| X509::from_der(c).map_err(|e| refused(e.to_string()));
        let leaf = der(end_entity)?;
        let mut chain = Stack::new().map_err(|e| refused(e.to_string()))?;
        for c in intermediates {
            chain.push(der(c)?).map_err(|e| refused(e.to_string()))?;
        }
        let mut context = X509StoreContext::new().map_err(|e| refused(e.to_string()))?;
        let verified = context
            .init(&self.store, &leaf, &chain, |c| {
                Ok(c.verify_cert()?.then_some(()).ok_or_else(|| c.error()))
            })
            .map_err(|e| refused(e.to_string()))?;
        verified.map_err(|e| refused(format!("certificate verify failed: {e}")))?;
        if !names(&leaf, server_name) {
            return Err(refused(format!(
                "certificate is not valid for {}",
                server_name.to_str()
            )));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// curl's host check (lib/vtls/openssl.c, `ossl_verifyhost`): the names
/// of the subjectAltName when it has any (an address against its IP
/// entries, a host name against its DNS entries, `*.` matching one
/// leftmost label); without one, the subject's common name.
fn names(cert: &X509, server: &ServerName<'_>) -> bool {
    let host = server.to_str();
    let ip: Option<IpAddr> = host.parse().ok();
    if let Some(alt) = cert.subject_alt_names() {
        return alt.iter().any(|name| match ip {
            Some(ip) => name.ipaddress().is_some_and(|b| match ip {
                IpAddr::V4(v4) => b == v4.octets(),
                IpAddr::V6(v6) => b == v6.octets(),
            }),
            None => name.dnsname().is_some_and(|n| dns_matches(n, &host)),
        });
    }
    cert.subject_name()
        .entries_by_nid(openssl::nid::Nid::COMMONNAME)
        .last()
        .and_then(|cn| cn.data().to_string().ok())
        .is_some_and(|cn| match ip {
            Some(_) => cn == host,
            None => dns_matches(&cn, &host),
        })
}

fn dns_matches(pattern: &str, host: &str) -> bool {
    let (pattern, host) = (pattern.to_ascii_lowercase(), host.to_ascii_lowercase());
    match pattern.strip_prefix("*.") {
        Some(rest) => host
            .split_once('.')
            .is_some_and(|(label, tail)| !label.is_empty() && tail == rest),
        None => pattern == host,
    }
}
