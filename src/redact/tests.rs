//! Unit and property tests of the redaction rules (`src/redact.rs`).

use super::*;
use proptest::prelude::*;

#[test]
fn urls_show_everything_but_their_secrets() {
    for (given, shown) in [
        (
            "postgres://app:hunter2@db:5432/x",
            "postgres://app:****@db:5432/x",
        ),
        ("postgres://app@db/x", "postgres://app@db/x"),
        ("postgres://app:@db/x", "postgres://app:@db/x"),
        // Unencoded `@`, `/` and `?` in a password: up to the last `@`.
        ("postgres://app:p@ss@db/x", "postgres://app:****@db/x"),
        ("postgres://app:pa/ss?x@db/x", "postgres://app:****@db/x"),
        // libpq's several hosts.
        (
            "postgresql://app:pw@h1:5432,h2:5433/x",
            "postgresql://app:****@h1:5432,h2:5433/x",
        ),
        (
            "postgres://db/x?user=app&password=hunter2&sslmode=require",
            "postgres://db/x?user=app&password=****&sslmode=require",
        ),
        (
            "postgres://db/x?sslpassword=k3y&sslkey=/etc/k.pem&Password=a&b&sslmode=require",
            "postgres://db/x?sslpassword=****&sslkey=/etc/k.pem&Password=****&sslmode=require",
        ),
        ("nats://tok@n:4222", "nats://****@n:4222"),
        ("nats://worker:pw@n:4222", "nats://worker:****@n:4222"),
        ("tls://n:4222", "tls://n:4222"),
        (
            "http://app:pw@127.0.0.1:8080/jobs",
            "http://app:****@127.0.0.1:8080/jobs",
        ),
        ("http://k3y@127.0.0.1/jobs", "http://****@127.0.0.1/jobs"),
        ("http://k3y:@127.0.0.1/jobs", "http://****@127.0.0.1/jobs"),
        (
            "http://127.0.0.1/jobs?api_key=abc&x=1&access_token=def",
            "http://127.0.0.1/jobs?api_key=****&x=1&access_token=****",
        ),
        (
            "http://127.0.0.1:8080/jobs?page=2",
            "http://127.0.0.1:8080/jobs?page=2",
        ),
        // Without a scheme, still user information.
        ("app:pw@db:5432/x", "****@db:5432/x"),
        ("nats:/tok@n:4222", "****@n:4222"),
        // A NATS seed list: each server's credentials hidden, every host shown.
        (
            "nats://a:pw1@n1:4222,nats://n2:4222, tls://tok@n3:4222",
            "nats://a:****@n1:4222,nats://n2:4222, tls://****@n3:4222",
        ),
        (
            "nats://n1:4222,nats://b:p@ss@n2:4222",
            "nats://n1:4222,nats://b:****@n2:4222",
        ),
    ] {
        assert_eq!(url(given), shown, "{given}");
    }
    // Neither a URL nor a connection string: nothing of it is shown.
    assert_eq!(url("hunter2"), NOT_SHOWN);
    assert_eq!(url(""), "");
}

#[test]
fn connection_strings_show_everything_but_their_secrets() {
    for (given, shown) in [
        (
            "host=db password='a b' user=app",
            "host=db password=**** user=app",
        ),
        (
            "host=db password='a\\'b c' user=app",
            "host=db password=**** user=app",
        ),
        (
            "host=db password=12345678 dbname=x",
            "host=db password=**** dbname=x",
        ),
        ("host=db password = s3cret", "host=db password = ****"),
        // Not quoted, with spaces: up to the next `key=`.
        (
            "host=db password=a b c user=app",
            "host=db password=**** user=app",
        ),
        // No closing quote: to the end.
        ("host=db password='open user=app", "host=db password=****"),
        (
            "host=db sslpassword=k sslkey=/k.pem",
            "host=db sslpassword=**** sslkey=/k.pem",
        ),
        ("host=db user=app", "host=db user=app"),
    ] {
        assert_eq!(url(given), shown, "{given}");
    }
}

#[test]
fn credential_headers_keep_their_scheme_only() {
    assert_eq!(header("Authorization", "Basic YXBwOnB3"), "Basic ****");
    assert_eq!(header("authorization", "Bearer abc.def"), "Bearer ****");
    assert_eq!(header("Authorization", "opaque"), MASK);
    assert_eq!(header("Cookie", "jw_admin=abc"), MASK);
    assert_eq!(header("X-Api-Key", "abc"), MASK);
    assert_eq!(header("X-Auth-Token", "abc"), MASK);
    assert_eq!(header("traceparent", "00-abc-01"), "00-abc-01");
    assert_eq!(
        header("Content-Type", "application/json"),
        "application/json"
    );
}

#[test]
fn secret_names() {
    for n in [
        "password",
        "sslpassword",
        "PASSWORD",
        "token",
        "access_token",
        "X-Auth-Token",
        "api_key",
        "apikey",
        "API-KEY",
        "client_secret",
        "key",
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "nkey",
        "seed",
        "SSH_KEY",
    ] {
        assert!(is_secret_name(n), "{n}");
    }
    for n in [
        "user",
        "host",
        "sslkey",
        "sslcert",
        "sslrootcert",
        "sslmode",
        "dbname",
        "monkey",
        "keyboard",
        "page",
        "IMAGE_MAX_WIDTH",
    ] {
        assert!(!is_secret_name(n), "{n}");
    }
}

#[test]
fn known_secrets_are_scrubbed_from_any_text_as_written_and_decoded() {
    let mut s = Secrets::new();
    s.add_url("http://app:p%40ss-word@127.0.0.1/x");
    s.add_url("host=db password='a \\'b c'");
    s.add("abc"); // too short to look for
    let text = "denied app:p@ss-word (p%40ss-word); a 'b c; abc";
    assert_eq!(s.scrub(text), "denied app:**** (****); ****; abc");
    assert_eq!(format!("{s:?}"), "Secrets(4 values)");
    // Nothing to hide: the text itself, not a copy.
    assert!(matches!(s.scrub("fine"), Cow::Borrowed("fine")));
    // A secret formed again across a mask's edge is masked too.
    let mut s = Secrets::new();
    s.add("*aa*");
    assert_eq!(s.scrub("*aa*aa*"), "*******");
    // Only `*`: never looked for (it would never end).
    s.add("*****");
    assert_eq!(s.scrub("*****"), "*****");
}

#[test]
fn the_log_writer_scrubs_remembered_secrets() {
    use std::io::Write;
    let mut s = Secrets::new();
    s.add("remembered-Secret-42");
    remember(&s);
    let mut w = ScrubbedWriter(Vec::new());
    w.write_all(b"connecting with remembered-Secret-42 now\n")
        .unwrap();
    assert_eq!(
        String::from_utf8(w.0).unwrap(),
        "connecting with **** now\n"
    );
    assert_eq!(known("x remembered-Secret-42"), "x ****");
}

/// A password of upper-case letters and the characters that delimit URLs, with at
/// least one letter: everything else in the generated URLs is lower-case, so an
/// upper-case letter in the output is a piece of the password.
fn password() -> impl Strategy<Value = String> {
    "[A-Z@:/?#&=%+ ]{0,8}[A-Z][A-Z@:/?#&=%+ ]{0,8}"
}

fn scheme() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "postgres",
        "postgresql",
        "nats",
        "tls",
        "http",
        "https",
    ])
}

/// Host, port, path and query, none of them secret (parameter names of `a`-`f`).
fn location() -> impl Strategy<Value = String> {
    (
        "[a-z][a-z0-9.-]{0,10}",
        prop::option::of(1u16..),
        "(/[a-z0-9._-]{0,6}){0,3}",
        prop::option::of("q[a-f]{0,3}=[a-z0-9]{0,5}(&q[a-f]{0,3}=[a-z0-9]{0,5}){0,2}"),
    )
        .prop_map(|(host, port, path, query)| {
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let query = query.map(|q| format!("?{q}")).unwrap_or_default();
            format!("{host}{port}{path}{query}")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_urls_password_never_shows(
        scheme in scheme(), user in "[a-z]{1,8}", pw in password(), at in location(),
    ) {
        let given = format!("{scheme}://{user}:{pw}@{at}");
        let shown = url(&given);
        prop_assert!(!shown.chars().any(|c| c.is_ascii_uppercase()), "{given} -> {shown}");
        // Without a `?` in the password, only the password is hidden.
        if !pw.contains('?') {
            prop_assert_eq!(shown, format!("{scheme}://{user}:****@{at}"));
        }
    }

    #[test]
    fn a_token_as_the_user_never_shows(
        scheme in prop::sample::select(vec!["nats", "tls", "http"]),
        token in "[A-Z0-9_.-]{1,20}", at in location(),
    ) {
        let shown = url(&format!("{scheme}://{token}@{at}"));
        prop_assert_eq!(shown, format!("{scheme}://****@{at}"));
    }

    #[test]
    fn secret_query_parameters_never_show(
        scheme in scheme(), host in "[a-z]{1,8}",
        name in prop::sample::select(vec!["password", "sslpassword", "token", "api_key", "access-token", "key"]),
        value in "[A-Z/@:%+ ?&#]{0,6}[A-Z][A-Z/@:%+ ?&#]{0,6}",
        before in prop::option::of("q[a-f]{0,3}=[a-z]{0,4}"),
        after in prop::option::of("q[a-f]{0,3}=[a-z]{0,4}"),
    ) {
        let mut query: Vec<String> = before.into_iter().collect();
        query.push(format!("{name}={value}"));
        query.extend(after);
        let given = format!("{scheme}://{host}/x?{}", query.join("&"));
        let shown = url(&given);
        prop_assert!(!shown.chars().any(|c| c.is_ascii_uppercase()), "{given} -> {shown}");
    }

    #[test]
    fn a_connection_strings_password_never_shows(
        pw in "[A-Z' \\\\=@]{0,8}[A-Z][A-Z' \\\\=@]{0,8}",
        key in prop::sample::select(vec!["password", "sslpassword"]),
        quoted in any::<bool>(),
        others in prop::collection::vec(("(host|user|dbname|port|sslmode)", "[a-z0-9]{1,6}"), 0..4),
        at in 0usize..4,
    ) {
        // Quoted as libpq reads it, or unquoted: also, wrongly, with spaces (a string that
        // does not parse, which error messages show).
        let value = if quoted || pw.contains(['\'', '\\', '=']) {
            format!("'{}'", pw.replace('\\', "\\\\").replace('\'', "\\'"))
        } else {
            pw.split_whitespace().collect::<Vec<_>>().join(" ")
        };
        let mut entries: Vec<String> = others.iter().map(|(k, v)| format!("{k}={v}")).collect();
        entries.insert(at.min(entries.len()), format!("{key}={value}"));
        let given = entries.join(" ");
        let shown = url(&given);
        prop_assert!(!shown.chars().any(|c| c.is_ascii_uppercase()), "{given} -> {shown}");
        let mut expected = entries.clone();
        expected[at.min(others.len())] = format!("{key}=****");
        prop_assert_eq!(shown, expected.join(" "));
    }

    #[test]
    fn a_seed_lists_passwords_never_show(
        servers in prop::collection::vec(
            (prop::sample::select(vec!["nats", "tls"]), prop::option::of(("[a-z]{1,8}", password())), location()),
            1..4,
        ),
        sep in prop::sample::select(vec![",", ", "]),
    ) {
        let entry = |(scheme, cred, at): &(&str, Option<(String, String)>, String), pw: &str| match cred {
            Some((user, _)) => format!("{scheme}://{user}:{pw}@{at}"),
            None => format!("{scheme}://{at}"),
        };
        let given: Vec<String> = servers
            .iter()
            .map(|s| entry(s, s.1.as_ref().map_or("", |c| c.1.as_str())))
            .collect();
        let given = given.join(sep);
        let shown = url(&given);
        prop_assert!(!shown.chars().any(|c| c.is_ascii_uppercase()), "{given} -> {shown}");
        // Without a `?` in a password, each server is shown but its password.
        if servers.iter().all(|s| s.1.as_ref().is_none_or(|c| !c.1.contains('?'))) {
            let expected: Vec<String> = servers.iter().map(|s| entry(s, "****")).collect();
            prop_assert_eq!(shown, expected.join(sep));
        }
    }

    #[test]
    fn urls_without_secrets_are_shown_as_given(scheme in scheme(), at in location()) {
        let given = format!("{scheme}://{at}");
        prop_assert_eq!(url(&given), given);
    }

    #[test]
    fn redaction_never_fails_and_is_stable(
        text in prop_oneof![".{0,40}", "[a-zA-Z:/@?&=' %#\\\\é€]{0,40}", "[a-z]{1,5}://[a-zA-Z:/@?&=' %#\\\\é€]{0,40}"],
    ) {
        let once = url(&text);
        prop_assert_eq!(url(&once), once.clone());
    }

    #[test]
    fn a_known_secret_never_survives_scrubbing(
        secret in "[a-z*]{0,3}[a-z][a-z*]{3,8}",
        parts in prop::collection::vec(prop::option::of("[a-z* ]{0,6}"), 0..8),
    ) {
        // The text: pieces of noise with the secret between some of them.
        let text: String = parts
            .iter()
            .map(|p| p.clone().unwrap_or_else(|| secret.clone()))
            .collect();
        let mut s = Secrets::new();
        s.add(&secret);
        let clean = s.scrub(&text);
        prop_assert!(!clean.contains(secret.as_str()), "{text:?} -> {clean:?}");
    }
}
