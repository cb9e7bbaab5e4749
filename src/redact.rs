//! Redaction: the one place that decides which part of a URL, a connection string, a
//! header or any text is a secret, and hides it behind [`MASK`].
//!
//! Every error and log line that shows a URL (database, NATS, HTTP handler), a libpq
//! `key=value` string or a header goes through [`url`] or [`header`]; text that may echo a
//! secret (a library's error, an application's error page) goes through
//! [`Secrets::scrub`] with the secret values known to the caller. The process's log writer
//! scrubs every line with the values of the loaded configuration ([`remember`],
//! [`Scrubbed`]). The rules are stated for operators in `docs/security.md`.
//!
//! The rules err on hiding: a URL's user information is taken to end at its *last* `@`
//! (a password may hold an unencoded `@`, `/` or `?`), and a secret's value in a query or
//! a `key=value` string runs to the next `name=` (a value may hold an unencoded `&` or an
//! unquoted space). Malformed input is redacted, never refused: these functions also
//! render the values that error messages are about.

use std::borrow::Cow;
use std::io;
use std::ops::Range;
use std::sync::RwLock;

/// What a secret is replaced with.
pub const MASK: &str = "****";

/// What [`url`] shows of a value that is neither a URL nor a connection string.
pub const NOT_SHOWN: &str = "(not shown: neither a URL nor a connection string)";

/// Shortest known secret that [`Secrets::scrub`] looks for in free text: shorter ones
/// would match ordinary words. They are still masked where they stand in a URL, a
/// connection string or a setting.
pub const MIN_SCRUBBED_LEN: usize = 4;

/// Whether a query parameter, a libpq key, an environment variable or a header is named
/// like a secret (`password`, `sslpassword`, `token`, `api_key`, `client_secret`, …).
/// Case and `-`/`_` do not matter. `sslkey`, `sslcert` and `sslrootcert` name files, not
/// secrets.
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase().replace('-', "_");
    const EXACT: [&str; 12] = [
        "key",
        "apikey",
        "auth",
        "authorization",
        "sig",
        "signature",
        "jwt",
        "nkey",
        "seed",
        "pass",
        "pwd",
        "cookie",
    ];
    const PARTS: [&str; 8] = [
        "password",
        "passwd",
        "passphrase",
        "token",
        "secret",
        "credential",
        "api_key",
        "access_key",
    ];
    EXACT.contains(&n.as_str()) || PARTS.iter().any(|p| n.contains(p)) || n.ends_with("_key")
}

/// Whether a header carries credentials (`Authorization`, `Proxy-Authorization`,
/// `Cookie`, `Set-Cookie`, and any header named like a secret, e.g. `X-Api-Key`).
pub fn is_credential_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || is_secret_name(&n)
}

/// A header's value as it may be shown: a credential header's value masked (its scheme
/// kept: `Basic ****`, `Bearer ****`), any other header's unchanged.
pub fn header<'a>(name: &str, value: &'a str) -> Cow<'a, str> {
    if !is_credential_header(name) {
        return Cow::Borrowed(value);
    }
    let n = name.to_ascii_lowercase();
    if n == "authorization" || n == "proxy-authorization" {
        // `<scheme> <credentials>`: the scheme says how, and is no secret.
        if let Some((scheme, _)) = value.trim_start().split_once(' ') {
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                return Cow::Owned(format!("{scheme} {MASK}"));
            }
        }
    }
    Cow::Borrowed(MASK)
}

/// A URL (`scheme://…`) or a libpq `key=value` connection string, as it may be shown:
///
/// - a URL's password (`user:password@`) becomes `user:****@`; user information without
///   a password is kept for `postgres://` (a user name) and masked for every other scheme
///   (`nats://<token>@`, `http://<key>@`);
/// - the values of query parameters named like secrets ([`is_secret_name`]:
///   `password`, `sslpassword`, `token`, …) become `****`;
/// - in a `key=value` string, the values of keys named like secrets, quoted or not;
/// - text that is neither is not shown at all (it may be a secret given in the wrong
///   setting).
pub fn url(text: &str) -> String {
    if !text.contains("://") && !text.contains('=') && !text.contains('@') {
        return if text.is_empty() {
            String::new()
        } else {
            NOT_SHOWN.into()
        };
    }
    mask(text, &secret_ranges(text))
}

/// The parts of a URL or connection string that are secrets, by byte range.
fn secret_ranges(text: &str) -> Vec<Range<usize>> {
    match scheme_end(text) {
        Some(rest_at) => {
            // A list of servers (`nats://a:4222,nats://b:4222`): each URL on its own, so one
            // server's `@` does not reach into the next.
            let starts = list_starts(text);
            if starts.len() == 1 {
                return url_ranges(text, rest_at);
            }
            let ends = starts.iter().skip(1).map(|s| s - 1).chain([text.len()]);
            starts
                .iter()
                .zip(ends)
                .flat_map(|(&from, to)| {
                    let item = &text[from..to];
                    let lead = item.len() - item.trim_start().len();
                    let item = &item[lead..];
                    let shift = from + lead;
                    match scheme_end(item) {
                        Some(rest_at) => url_ranges(item, rest_at),
                        None => std::iter::once(0..item.len()).collect(),
                    }
                    .into_iter()
                    .map(move |r| r.start + shift..r.end + shift)
                })
                .collect()
        }
        None => {
            let mut ranges = dsn_ranges(text);
            // No scheme, yet user information (`app:pw@db/x`): everything before the last
            // `@` may be a password.
            if let Some(at) = text.rfind('@') {
                if !text[..at].contains('=') {
                    ranges.push(0..at);
                }
            }
            ranges
        }
    }
}

/// Where each URL of a comma-separated list starts: at 0, and after every comma that is
/// followed (past spaces) by another `scheme://`. A comma anywhere else belongs to the URL
/// it is in (libpq's `h1:5432,h2:5433`, an unencoded comma in a password).
fn list_starts(text: &str) -> Vec<usize> {
    let mut starts = vec![0];
    for (i, _) in text.match_indices(',') {
        if scheme_end(text[i + 1..].trim_start()).is_some() {
            starts.push(i + 1);
        }
    }
    starts
}

/// Where the part after `scheme://` starts, if `text` starts with a scheme
/// (`[A-Za-z][A-Za-z0-9+.-]*://`).
fn scheme_end(text: &str) -> Option<usize> {
    let sep = text.find("://")?;
    let scheme = &text[..sep];
    let mut chars = scheme.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'));
    ok.then_some(sep + 3)
}

fn url_ranges(text: &str, rest_at: usize) -> Vec<Range<usize>> {
    let scheme = text[..rest_at - 3].to_ascii_lowercase();
    let rest = &text[rest_at..];
    let mut ranges = Vec::new();
    // User information: up to the last `@` (a password may hold `@`, `/`, `?` unencoded).
    if let Some(at) = rest.rfind('@') {
        let userinfo = &rest[..at];
        match userinfo.find(':') {
            // `user:password`: a user with an empty password is a key given as the user
            // (`http://<key>:@host`), except for PostgreSQL.
            Some(colon) if colon + 1 < at || scheme.starts_with("postgres") => {
                ranges.push(rest_at + colon + 1..rest_at + at);
            }
            Some(_) => ranges.push(rest_at..rest_at + at),
            // A lone user name: PostgreSQL's is a role name; anything else is a token.
            None if scheme.starts_with("postgres") => {}
            None => ranges.push(rest_at..rest_at + at),
        }
    }
    if let Some(q) = rest.find('?') {
        let query_at = rest_at + q + 1;
        ranges.extend(param_ranges(text, query_at, b'&'));
    }
    ranges
}

/// The values of secret parameters in `text[from..]`, `name=value` pairs separated by
/// `sep`. A secret's value runs to the next `<sep>name=` (or the end), so an unencoded
/// separator inside it is hidden too.
fn param_ranges(text: &str, from: usize, sep: u8) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut ranges = Vec::new();
    let mut i = from;
    while i < bytes.len() {
        let end = next_pair(bytes, i, sep).unwrap_or(bytes.len());
        let pair = &text[i..end];
        if let Some(eq) = pair.find('=') {
            let name = percent_encoding::percent_decode_str(&pair[..eq]).decode_utf8_lossy();
            if is_secret_name(name.trim()) && eq + 1 < pair.len() {
                ranges.push(i + eq + 1..end);
            }
        }
        i = end + 1;
    }
    ranges
}

/// The position of the next `sep` that starts another `name=` pair after `from`.
fn next_pair(bytes: &[u8], from: usize, sep: u8) -> Option<usize> {
    let mut i = from;
    while let Some(p) = bytes[i..].iter().position(|&b| b == sep) {
        let at = i + p;
        let name_len = bytes[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'%'))
            .count();
        if name_len > 0 && bytes.get(at + 1 + name_len) == Some(&b'=') {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

/// The values of secret keys in a libpq `key=value` string. Quoted values (`'a b\'c'`) end
/// at their closing quote (or the end of the text, when there is none); an unquoted
/// secret's value runs to the next ` name=` (an unquoted space does not end it).
fn dsn_ranges(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key_at = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &text[key_at..i];
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] != b'=' {
            // A word that is not `key=value`; go on with the next one.
            continue;
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let value_at = i;
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            while i < bytes.len() && bytes[i] != b'\'' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
        } else if is_secret_name(key) {
            i = next_word_pair(bytes, i).unwrap_or(bytes.len());
        } else {
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = i.min(bytes.len());
        }
        if is_secret_name(key) && i > value_at {
            ranges.push(value_at..i);
        }
    }
    ranges
}

/// The position of the next whitespace that is followed by `name=` after `from`.
fn next_word_pair(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < bytes.len() {
        if bytes[i].is_ascii_whitespace() {
            let mut j = i;
            while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                j += 1;
            }
            let name_len = bytes[j..]
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                .count();
            let mut k = j + name_len;
            while k < bytes.len() && bytes[k].is_ascii_whitespace() {
                k += 1;
            }
            if name_len > 0 && bytes.get(k) == Some(&b'=') {
                return Some(i);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    None
}

/// `text` with each of `ranges` (merged where they overlap or touch) replaced by one
/// [`MASK`].
fn mask(text: &str, ranges: &[Range<usize>]) -> String {
    let mut ranges: Vec<Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for r in merged {
        out.push_str(&text[at..r.start]);
        out.push_str(MASK);
        at = r.end;
    }
    out.push_str(&text[at..]);
    out
}

/// Secret values known to the caller (a configured password, a token, the credentials in
/// a URL), to be scrubbed from text that may echo them: a library's error, an
/// application's error page. Its `Debug` shows how many it holds, never them.
#[derive(Clone, Default)]
pub struct Secrets {
    /// Longest first, so a secret that contains another is masked whole.
    values: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.values.len())
    }
}

impl Secrets {
    pub const fn new() -> Secrets {
        Secrets { values: Vec::new() }
    }

    /// Adds a secret value. Values shorter than [`MIN_SCRUBBED_LEN`] characters, or made
    /// only of the mask's `*`, are not searched for.
    pub fn add(&mut self, value: &str) -> &mut Secrets {
        if value.chars().count() >= MIN_SCRUBBED_LEN
            && !value.chars().all(|c| c == '*')
            && !self.values.iter().any(|v| v == value)
        {
            self.values.push(value.to_string());
            self.values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        }
        self
    }

    /// Adds the secrets of a URL or connection string (the parts [`url`] masks), as
    /// written and decoded (`p%40ss` and `p@ss`; `'a b'` and `a b`).
    pub fn add_url(&mut self, text: &str) -> &mut Secrets {
        for r in secret_ranges(text) {
            let raw = &text[r];
            self.add(raw);
            self.add(&percent_encoding::percent_decode_str(raw).decode_utf8_lossy());
            if let Some(quoted) = raw.strip_prefix('\'') {
                let inner = quoted.strip_suffix('\'').unwrap_or(quoted);
                self.add(&unescape(inner));
            }
        }
        self
    }

    /// Adds every value of `other`.
    pub fn extend(&mut self, other: &Secrets) -> &mut Secrets {
        for v in &other.values {
            self.add(v);
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The length in bytes of the longest secret (0 when there is none): text cut to a
    /// length must be scrubbed with this much more of it, so that no secret is cut in two.
    pub fn longest(&self) -> usize {
        self.values.first().map_or(0, String::len)
    }

    /// `text` with every occurrence of a known secret replaced by [`MASK`]. Repeated until
    /// none is left, so that no secret is formed again across a mask's edge.
    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        // Ends: each replacement removes at least one character that is not `*`, and the
        // mask adds none.
        loop {
            let mut changed = false;
            for v in &self.values {
                if out.contains(v.as_str()) {
                    out = Cow::Owned(out.replace(v.as_str(), MASK));
                    changed = true;
                }
            }
            if !changed {
                return out;
            }
        }
    }
}

/// A libpq quoted value's text: `\x` is `x`.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// The secrets of the configuration this process loaded (and of files it read, such as an
/// nkey seed), for the log writer and the command's last error message.
static KNOWN: RwLock<Secrets> = RwLock::new(Secrets::new());

/// Adds `secrets` to the ones this process hides from its logs ([`Scrubbed`]) and from
/// [`known`].
pub fn remember(secrets: &Secrets) {
    if secrets.is_empty() {
        return;
    }
    KNOWN
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .extend(secrets);
}

/// `text` scrubbed of every secret given to [`remember`].
pub fn known(text: &str) -> Cow<'_, str> {
    let known = KNOWN.read().unwrap_or_else(|e| e.into_inner());
    match known.scrub(text) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        Cow::Owned(s) => Cow::Owned(s),
    }
}

/// A log writer (tracing-subscriber's `MakeWriter`) that scrubs every line of the secrets
/// given to [`remember`] before it reaches `M`'s writer: whatever a library logs at debug
/// level, a configured password does not reach the log.
pub struct Scrubbed<M>(pub M);

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for Scrubbed<M>
{
    type Writer = ScrubbedWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedWriter(self.0.make_writer())
    }
}

/// The writer of [`Scrubbed`]. tracing-subscriber writes each event in one `write_all`,
/// so a secret is never split between two writes.
pub struct ScrubbedWriter<W>(W);

impl<W: io::Write> io::Write for ScrubbedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        match known(&text) {
            Cow::Borrowed(_) => self.0.write_all(buf)?,
            Cow::Owned(clean) => self.0.write_all(clean.as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests;
