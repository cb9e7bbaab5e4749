//! A PostgreSQL connection string's TLS parameters, with libpq's `sslmode` semantics:
//! parsed here, with no I/O, so the configuration's check and the store's connector read them
//! alike (the connector itself is `store/tls.rs`).
//!
//! tokio-postgres knows only `disable`, `prefer` and `require`, and no certificate files;
//! managed PostgreSQL services tell their users to connect with
//! `sslmode=verify-full&sslrootcert=<their CA>`. So the URL's TLS parameters are taken out
//! here before tokio-postgres parses the rest:
//!
//! | `sslmode` | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default, as libpq) | when the server offers it | no |
//! | `require` | always | no (as libpq: checked like `verify-ca` when `sslrootcert` is given) |
//! | `verify-ca` | always | signed by a trusted CA |
//! | `verify-full` | always | signed by a trusted CA and issued for the host name (or IP) |
//!
//! `sslrootcert=<file>` names the PEM file of the CA(s) to trust; `sslrootcert=system`, or no
//! `sslrootcert` at all, trusts the operating system's store (libpq would look for
//! `~/.postgresql/root.crt`; a container has no home to put it in). `sslcert` and `sslkey`
//! name a client certificate and its key (PEM).

use std::path::PathBuf;
use tokio_postgres::config::SslMode as PgSslMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow is not supported; use prefer (TLS when the server \
                            offers it) or require"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, \
                     verify-full"
                ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Which CAs a verifying mode trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The operating system's store (`sslrootcert=system`, or none given).
    System,
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
}

/// The TLS settings of a database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    pub mode: SslMode,
    /// Given explicitly with `sslrootcert`.
    pub root: Option<RootCerts>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl PgTls {
    /// Takes the TLS parameters out of a `postgres://` URL or a libpq `key=value` string.
    /// Returns the rest (for tokio-postgres to parse) and the settings.
    pub fn split(url: &str) -> Result<(String, PgTls), String> {
        let mut tls = PgTls {
            mode: SslMode::Prefer,
            root: None,
            client_cert: None,
            client_key: None,
        };
        let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let Some((base, query)) = url.split_once('?') else {
                return Ok((url.to_string(), tls));
            };
            let mut kept = Vec::new();
            for raw in query.split('&').filter(|p| !p.is_empty()) {
                let (key, value) = form_urlencoded::parse(raw.as_bytes())
                    .next()
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .unwrap_or_default();
                if !tls.take(&key, &value)? {
                    kept.push(raw);
                }
            }
            if kept.is_empty() {
                base.to_string()
            } else {
                format!("{base}?{}", kept.join("&"))
            }
        } else {
            let mut kept = Vec::new();
            for (key, value, raw) in key_values(url)? {
                if !tls.take(&key, &value)? {
                    kept.push(raw);
                }
            }
            kept.join(" ")
        };
        if tls.client_cert.is_some() != tls.client_key.is_some() {
            return Err(
                "sslcert and sslkey go together: give both (the client certificate \
                        and its private key, PEM files) or neither"
                    .into(),
            );
        }
        if tls.mode == SslMode::Disable && (tls.root.is_some() || tls.client_cert.is_some()) {
            return Err(
                "sslmode=disable with certificate files: remove sslrootcert/sslcert/\
                        sslkey, or choose sslmode=verify-full to use them"
                    .into(),
            );
        }
        Ok((rest, tls))
    }

    /// Records a TLS parameter; false when `key` is not one.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, String> {
        match key {
            "sslmode" => self.mode = SslMode::parse(value)?,
            "sslrootcert" if value == "system" => self.root = Some(RootCerts::System),
            "sslrootcert" => self.root = Some(RootCerts::File(PathBuf::from(value))),
            "sslcert" => self.client_cert = Some(PathBuf::from(value)),
            "sslkey" => self.client_key = Some(PathBuf::from(value)),
            "sslpassword" | "sslcrl" | "sslcrldir" => {
                return Err(format!(
                    "{key} is not supported; use an unencrypted key file (sslkey) and leave \
                     revocation to the CA's short-lived certificates"
                ))
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// What tokio-postgres should do: it only knows whether TLS is off, optional or required;
    /// certificate checks are the connector's.
    pub fn pg_mode(&self) -> PgSslMode {
        match self.mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            _ => PgSslMode::Require,
        }
    }

    /// How the server's certificate is checked, after libpq's rule that `require` with a CA
    /// file given checks like `verify-ca`.
    pub fn effective_mode(&self) -> SslMode {
        match (self.mode, &self.root) {
            (SslMode::Require, Some(RootCerts::File(_))) => SslMode::VerifyCa,
            (m, _) => m,
        }
    }

    /// One line for the start-up log: "TLS verify-full (CA /etc/ca.pem)".
    pub fn describe(&self) -> String {
        let mode = self.effective_mode();
        let roots = match (&self.root, mode) {
            (_, SslMode::Disable | SslMode::Prefer | SslMode::Require) => String::new(),
            (Some(RootCerts::File(p)), _) => format!(", CA {}", p.display()),
            (Some(RootCerts::System) | None, _) => ", CA from the system store".into(),
        };
        let client = match &self.client_cert {
            Some(p) => format!(", client certificate {}", p.display()),
            None => String::new(),
        };
        format!("sslmode {}{roots}{client}", mode.as_str())
    }
}

/// Splits a libpq `key=value` connection string into (key, value, the entry's own text).
/// Values may be quoted with `'…'`; a backslash escapes the next character. An error never
/// quotes a value, nor the word after a secret's value (it may be the rest of a password
/// with a space).
pub(crate) fn key_values(s: &str) -> Result<Vec<(String, String, &str)>, String> {
    let mut out: Vec<(String, String, &str)> = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() {
            break;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = s[start..i].to_string();
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() || bytes[i] != b'=' {
            return Err(match out.last() {
                // The word may be the rest of a password with an unquoted space.
                Some((previous, _, _)) if crate::redact::is_secret_name(previous) => format!(
                    "a word after {previous}=… is not a key=value pair; quote a value that \
                     has spaces ({previous}='a b'), and write key=value pairs, e.g. host=db \
                     user=app dbname=app"
                ),
                _ => format!(
                    "{key:?} has no value; write key=value pairs, e.g. host=db user=app \
                     dbname=app"
                ),
            });
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = Vec::new();
        if i < bytes.len() && bytes[i] == b'\'' {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => return Err(format!("the value of {key} has no closing quote")),
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < bytes.len() => {
                        value.push(bytes[i + 1]);
                        i += 2;
                    }
                    Some(&b) => {
                        value.push(b);
                        i += 1;
                    }
                }
            }
        } else {
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                if bytes[i] == b'\\' && i + 1 < bytes.len() {
                    i += 1;
                }
                value.push(bytes[i]);
                i += 1;
            }
        }
        out.push((
            key,
            String::from_utf8_lossy(&value).into_owned(),
            &s[start..i],
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_urls_and_key_value_strings() {
        let (rest, tls) = PgTls::split(
            "postgres://app:p%40ss@db:5432/app?sslmode=verify-full&application_name=x&sslrootcert=/etc/ca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://app:p%40ss@db:5432/app?application_name=x");
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root, Some(RootCerts::File("/etc/ca.pem".into())));
        assert_eq!(tls.pg_mode(), PgSslMode::Require);

        let (rest, tls) = PgTls::split(
            "host=db user=app password='a b\\'c' sslmode=verify-ca sslrootcert='/etc/my ca.pem' \
             sslcert=/c.pem sslkey=/k.pem dbname=app",
        )
        .unwrap();
        assert_eq!(rest, "host=db user=app password='a b\\'c' dbname=app");
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(tls.root, Some(RootCerts::File("/etc/my ca.pem".into())));
        assert_eq!(tls.client_key, Some("/k.pem".into()));

        let (rest, tls) = PgTls::split("postgres://db/app").unwrap();
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("postgres://db/app", SslMode::Prefer)
        );
        let (_, tls) =
            PgTls::split("postgres://db/app?sslrootcert=system&sslmode=require").unwrap();
        assert_eq!(tls.root, Some(RootCerts::System));
        assert_eq!(tls.effective_mode(), SslMode::Require);
        let (_, tls) =
            PgTls::split("postgres://db/app?sslrootcert=/ca.pem&sslmode=require").unwrap();
        assert_eq!(
            tls.effective_mode(),
            SslMode::VerifyCa,
            "libpq's rule for require + CA file"
        );
    }

    #[test]
    fn bad_tls_parameters_say_what_to_write() {
        let err = PgTls::split("postgres://db/app?sslmode=verify").unwrap_err();
        assert!(
            err.contains("\"verify\"") && err.contains("verify-full"),
            "{err}"
        );
        let err = PgTls::split("postgres://db/app?sslmode=verify-full&sslcert=/c.pem").unwrap_err();
        assert!(err.contains("sslkey"), "{err}");
        let err = PgTls::split("host=db sslmode").unwrap_err();
        assert!(err.contains("no value"), "{err}");
        // After a password, the word may be the rest of it: not quoted.
        let err = PgTls::split("host=db password=pass-A pass-B user=app").unwrap_err();
        assert!(
            err.contains("a word after password=…") && !err.contains("pass-"),
            "{err}"
        );
        let err = PgTls::split("host=db password='open").unwrap_err();
        assert!(err.contains("closing quote"), "{err}");
        let err =
            PgTls::split("postgres://db/app?sslmode=disable&sslrootcert=/ca.pem").unwrap_err();
        assert!(err.contains("verify-full"), "{err}");
    }
}
