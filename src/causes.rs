//! Finding a typed cause in an error's chain, so callers decide by type and code (a
//! `tokio_postgres::Error`'s SQLSTATE, a rustls error, an I/O error) rather than by the
//! words of a message.

use std::error::Error;

/// The first cause of type `T` in `e`'s chain, `e` included. An I/O error that wraps another
/// error is looked into as well (its `source()` skips the error it wraps).
pub fn find<'a, T: Error + 'static>(e: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(t) = err.downcast_ref::<T>() {
            return Some(t);
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(t) = find::<T>(inner) {
                return Some(t);
            }
        }
        next = err.source();
    }
    None
}

/// Whether TLS failed for a reason of its own (a certificate not trusted, a name that does
/// not match, a protocol the peer refuses): a rustls error among the causes.
pub fn tls_refused(e: &(dyn Error + 'static)) -> bool {
    find::<rustls::Error>(e).is_some()
}

/// Whether an I/O error is among the causes (the network, not the peer's words).
pub fn io_failed(e: &(dyn Error + 'static)) -> bool {
    find::<std::io::Error>(e).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(Box<dyn Error + Send + Sync>);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapper")
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn a_tls_error_is_found_inside_the_io_error_of_a_handshake_and_nothing_else_is_tls() {
        let cert = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, cert);
        let chain = Wrapper(Box::new(io));
        assert!(tls_refused(&chain));
        assert!(io_failed(&chain));
        let reset = Wrapper(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert!(!tls_refused(&reset));
        assert!(io_failed(&reset));
        let words = Wrapper("server does not support TLS".into());
        assert!(!tls_refused(&words) && !io_failed(&words));
    }
}
