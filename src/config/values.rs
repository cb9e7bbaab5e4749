//! Setting values written as text in the file and parsed once, at load: an address to
//! listen on, a listener that may be off, a rate limit, where a queue's messages carry their
//! key. Each keeps its text form for
//! `jobwarden config show`, and a value that does not parse is an error naming the setting,
//! the value and the right form.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// An address and port to listen on, e.g. `127.0.0.1:7433`; port 0 picks a free one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ListenAddr(pub SocketAddr);

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        text.parse().map(ListenAddr).map_err(|_| {
            format!(
                "{text:?} is not an address and port like 127.0.0.1:7433 (a numeric IP: \
                 0.0.0.0 or [::] for every interface; port 0 picks a free one)"
            )
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A listener that can be turned off: `"off"`, or an address as for [`ListenAddr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Listen {
    Off,
    At(ListenAddr),
}

impl FromStr for Listen {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "off" {
            return Ok(Listen::Off);
        }
        text.parse()
            .map(Listen::At)
            .map_err(|e| format!("{e}, or \"off\""))
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Off => f.write_str("off"),
            Listen::At(a) => a.fmt(f),
        }
    }
}

text_form!(ListenAddr, Listen, RateLimit, KeepFor, KeyFrom);

impl Listen {
    /// The address, unless the listener is off.
    pub fn addr(self) -> Option<SocketAddr> {
        match self {
            Listen::Off => None,
            Listen::At(a) => Some(a.0),
        }
    }
}

/// Starts per window, written `"<count>/<duration>"`: `"100/1m"`, `"20/10s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RateLimit {
    /// From 1 to [`RateLimit::MAX_STARTS`].
    pub starts: u32,
    /// From [`RateLimit::SHORTEST`] to [`RateLimit::LONGEST`].
    pub window: Duration,
}

impl RateLimit {
    pub const MAX_STARTS: u32 = 1_000_000;
    pub const SHORTEST: Duration = Duration::from_millis(100);
    pub const LONGEST: Duration = Duration::from_secs(7 * 24 * 3600);
}

impl FromStr for RateLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "{text:?} {why}: write starts per window as \"<count>/<duration>\", e.g. \
                 \"100/1m\", \"20/10s\" or \"5000/1h\""
            )
        };
        let (n, window) = text.split_once('/').ok_or_else(|| bad("has no '/'"))?;
        let starts: u32 = n
            .trim()
            .parse()
            .map_err(|_| bad("does not start with a whole number"))?;
        let window =
            humantime::parse_duration(window.trim()).map_err(|_| bad("has no valid duration"))?;
        if starts == 0 || starts > RateLimit::MAX_STARTS {
            return Err(bad("must allow from 1 to 1000000 starts"));
        }
        if window < RateLimit::SHORTEST || window > RateLimit::LONGEST {
            return Err(bad("must have a window from 100ms to 7d"));
        }
        Ok(RateLimit { starts, window })
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.starts,
            humantime::format_duration(self.window)
        )
    }
}

/// How long a finished row is kept before the pruner deletes it (`retention.keep_*`), e.g.
/// `"7d"`: from [`KeepFor::SHORTEST`] to ten years.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeepFor(pub Duration);

impl KeepFor {
    /// The shortest keep. A job must outlive every redelivery of its message (ack_wait,
    /// 10 min by default) and the stream's duplicate window: a message that arrives after
    /// its job was pruned makes the job again and runs it again.
    pub const SHORTEST: Duration = Duration::from_secs(3600);
}

impl FromStr for KeepFor {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let form = "write an age of at least 1h, e.g. \"7d\", \"36h\" or \"30d\"";
        let d = humantime::parse_duration(text.trim())
            .map_err(|_| format!("{text:?} is not an age: {form}"))?;
        if d < KeepFor::SHORTEST {
            return Err(format!(
                "{text:?} is shorter than 1h: a job pruned sooner could be made again and run \
                 again by a late redelivery of its message; {form}"
            ));
        }
        if d > super::MAX_DURATION {
            return Err(format!("{text:?} is longer than 3650 days; {form}"));
        }
        Ok(KeepFor(d))
    }
}

impl fmt::Display for KeepFor {
    /// In whole days or hours when it is some ("90d", not humantime's "2months 29days 2h
    /// 52m 48s", whose months are 30.44 days).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (secs, nanos) = (self.0.as_secs(), self.0.subsec_nanos());
        match (secs % 86_400, secs % 3600, nanos) {
            (0, _, 0) => write!(f, "{}d", secs / 86_400),
            (_, 0, 0) => write!(f, "{}h", secs / 3600),
            _ => f.write_str(&super::fmt_dur(self.0)),
        }
    }
}

/// Where a queue's messages carry their job's key when the envelope names none
/// (`[queues.<name>] key_from`): a field of the payload, as an RFC 6901 JSON pointer
/// (`"payload:/customer/id"`), or a NATS header (`"header:X-Customer"`, matched exactly:
/// NATS header names are case-sensitive). Messages only: SQL, the CLI, the Rust client and
/// cron name the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KeyFrom {
    /// A JSON pointer into the payload, e.g. `/customer/id` (never empty: the payload
    /// itself is an object, never a key).
    Payload(String),
    /// A header's name, as the NATS client accepts it (printable ASCII, no ':').
    Header(String),
}

impl FromStr for KeyFrom {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let form = "write \"payload:<JSON pointer>\" (RFC 6901, e.g. \"payload:/customer/id\") \
                    or \"header:<name>\" (e.g. \"header:X-Customer\")";
        match text.split_once(':') {
            Some(("payload", pointer)) => {
                if pointer.is_empty() {
                    return Err(format!(
                        "{text:?} names the whole payload, an object, never a key: name a field \
                         in it; {form}"
                    ));
                }
                if !pointer.starts_with('/') {
                    return Err(format!(
                        "{text:?} is not a JSON pointer: one starts with '/' and separates \
                         fields by '/' (\"customer.id\" is written \"/customer/id\"); {form}"
                    ));
                }
                let mut escapes = pointer.split('~').skip(1);
                if escapes.any(|after| !after.starts_with(['0', '1'])) {
                    return Err(format!(
                        "{text:?} has a '~' followed by neither 0 nor 1: a JSON pointer writes \
                         '~' in a field's name as ~0 and '/' as ~1; {form}"
                    ));
                }
                Ok(KeyFrom::Payload(pointer.to_string()))
            }
            Some(("header", name)) => {
                if name.is_empty() || name.contains(|c: char| !c.is_ascii_graphic() || c == ':') {
                    return Err(format!(
                        "{text:?} does not name a header: a NATS header name is 1 or more \
                         printable ASCII characters without spaces or ':'; {form}"
                    ));
                }
                Ok(KeyFrom::Header(name.to_string()))
            }
            _ => Err(format!("{text:?} does not say where the key is; {form}")),
        }
    }
}

impl fmt::Display for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFrom::Payload(pointer) => write!(f, "payload:{pointer}"),
            KeyFrom::Header(name) => write!(f, "header:{name}"),
        }
    }
}

impl KeyFrom {
    /// The key a message of queue `queue` carries where this says: `payload` is the job's
    /// payload, `header` reads a header of the message by name. A string is the key as it
    /// is, a whole number (an integer, as JSON writes it) its decimal text; nothing there
    /// (or JSON null) is no key. Any other value, or a text the job contract refuses as a
    /// key, is refused naming the field `key`, the setting and what was found (never the
    /// value itself: it may be long, or hold what a log line must not).
    pub fn pick(
        &self,
        queue: &str,
        payload: &serde_json::Value,
        header: impl FnOnce(&str) -> Option<String>,
    ) -> Result<Option<String>, crate::contract::Refused> {
        use serde_json::Value;
        let refuse = |found: String| crate::contract::Refused::BadValue {
            field: "key".into(),
            reason: format!("queues.{queue}.key_from = \"{self}\" found {found}"),
        };
        let key = match self {
            KeyFrom::Header(name) => match header(name) {
                None => return Ok(None),
                Some(text) => text,
            },
            KeyFrom::Payload(pointer) => match payload.pointer(pointer) {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                Some(Value::Number(n)) => {
                    return Err(refuse(format!(
                        "the number {n}, which is not an integer; a key taken from the payload \
                         is a string or an integer, e.g. \"customer-42\" or 42"
                    )))
                }
                Some(other) => {
                    return Err(refuse(format!(
                        "{}; a key taken from the payload is a string or an integer, e.g. \
                         \"customer-42\" or 42",
                        crate::contract::json_kind(other)
                    )))
                }
            },
        };
        match crate::contract::check_job_key(&key) {
            Ok(()) => Ok(Some(key)),
            Err(why) => Err(refuse(format!("a text that is no valid key ({why})"))),
        }
    }
}

/// A setting given as one string or as a list of strings (a NATS cluster's servers): kept
/// as one string, the list's items joined by commas, as the comma-separated form reads.
pub(super) fn one_or_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrList {
        One(String),
        List(Vec<String>),
    }
    match OneOrList::deserialize(d) {
        Ok(OneOrList::One(s)) => Ok(s),
        Ok(OneOrList::List(items)) => Ok(items.join(",")),
        Err(_) => Err(serde::de::Error::custom(
            "expected a URL string (\"nats://n1:4222\", or several separated by commas) or a \
             list of them ([\"nats://n1:4222\", \"nats://n2:4222\"])",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_and_print_back() {
        let a: ListenAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(String::from(a), "127.0.0.1:0");
        assert_eq!(
            "[::]:7434"
                .parse::<Listen>()
                .unwrap()
                .addr()
                .unwrap()
                .port(),
            7434
        );
        assert_eq!("off".parse::<Listen>(), Ok(Listen::Off));
        assert_eq!(String::from(Listen::Off), "off");
        let e = "localhost:7433".parse::<ListenAddr>().unwrap_err();
        assert!(
            e.contains("\"localhost:7433\" is not an address and port like 127.0.0.1:7433"),
            "{e}"
        );
        let e = "on".parse::<Listen>().unwrap_err();
        assert!(e.ends_with("or \"off\""), "{e}");
    }

    #[test]
    fn keep_ages_parse_print_back_or_say_the_right_form() {
        let k: KeepFor = "7d".parse().unwrap();
        assert_eq!(k.0, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(k.to_string(), "7d");
        for (text, shown) in [("90d", "90d"), ("36h", "36h"), ("1h 30m", "1h 30m")] {
            let k: KeepFor = text.parse().unwrap();
            assert_eq!(
                (k.to_string().as_str(), k.to_string().parse()),
                (shown, Ok(k))
            );
        }
        assert_eq!(k.to_string().parse::<KeepFor>(), Ok(k));
        let e = "a week".parse::<KeepFor>().unwrap_err();
        assert!(
            e.contains("\"a week\" is not an age") && e.contains("\"7d\""),
            "{e}"
        );
        let e = "0s".parse::<KeepFor>().unwrap_err();
        assert!(e.contains("shorter than 1h"), "{e}");
        assert!("-1d".parse::<KeepFor>().is_err());
        assert!("3651d".parse::<KeepFor>().is_err());
        assert_eq!("1h".parse::<KeepFor>().unwrap().0, KeepFor::SHORTEST);
    }

    #[test]
    fn key_from_parses_a_pointer_or_a_header_prints_back_or_says_the_right_form() {
        for text in [
            "payload:/customer/id",
            "payload:/a~1b/0",
            "payload:/",
            "header:X-Customer",
        ] {
            let k: KeyFrom = text.parse().unwrap();
            assert_eq!(k.to_string(), text);
        }
        assert_eq!(
            "header:X-Customer".parse::<KeyFrom>(),
            Ok(KeyFrom::Header("X-Customer".into()))
        );
        for (bad, words) in [
            ("customer", "does not say where the key is"),
            ("body:/customer", "does not say where the key is"),
            ("payload:", "names the whole payload"),
            ("payload:customer.id", "is not a JSON pointer"),
            ("payload:/a~2", "followed by neither 0 nor 1"),
            ("payload:/a~", "followed by neither 0 nor 1"),
            ("header:", "does not name a header"),
            ("header:X Customer", "does not name a header"),
            ("header:X:Customer", "does not name a header"),
            ("header:Ünder", "does not name a header"),
        ] {
            let e = bad.parse::<KeyFrom>().unwrap_err();
            assert!(
                e.contains(words) && e.contains("\"payload:/customer/id\""),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn key_from_takes_a_string_or_an_integer_and_refuses_the_rest_naming_the_field() {
        use serde_json::json;
        let from: KeyFrom = "payload:/customer/id".parse().unwrap();
        let pick = |payload: serde_json::Value| from.pick("email", &payload, |_| None);
        assert_eq!(
            pick(json!({"customer": {"id": "c-42"}})),
            Ok(Some("c-42".into()))
        );
        assert_eq!(pick(json!({"customer": {"id": 42}})), Ok(Some("42".into())));
        assert_eq!(
            pick(json!({"customer": {"id": u64::MAX}})),
            Ok(Some(u64::MAX.to_string()))
        );
        assert_eq!(pick(json!({"customer": {"id": -7}})), Ok(Some("-7".into())));
        assert_eq!(pick(json!({"customer": {"id": null}})), Ok(None));
        assert_eq!(pick(json!({"customer": {}})), Ok(None));
        assert_eq!(pick(json!({"customer": "c-42"})), Ok(None));
        for (value, words) in [
            (
                json!({"id": 1}),
                "found an object; a key taken from the payload is a string",
            ),
            (json!([1]), "found an array"),
            (json!(true), "found a boolean"),
            (json!(1.5), "found the number 1.5, which is not an integer"),
            (
                json!(42.0),
                "found the number 42.0, which is not an integer",
            ),
            (
                json!(""),
                "found a text that is no valid key (must not be empty",
            ),
            (json!("a b"), "(contains U+0020"),
            (json!(".."), "(\"..\" cannot be a key"),
            (
                json!("k".repeat(201)),
                "(is 201 bytes long, the limit is 200",
            ),
        ] {
            let e = pick(json!({"customer": {"id": value}})).unwrap_err();
            assert_eq!(e.field(), "key");
            let text = e.to_string();
            assert!(
                text.starts_with(
                    "field `key` is invalid: queues.email.key_from = \"payload:/customer/id\" found "
                ) && text.contains(words),
                "{text}"
            );
        }
        let from: KeyFrom = "header:X-Customer".parse().unwrap();
        let seen = std::cell::Cell::new(String::new());
        let got = from.pick("email", &json!({"customer": "ignored"}), |name| {
            seen.set(name.to_string());
            Some("c-7".into())
        });
        assert_eq!(
            (got, seen.take()),
            (Ok(Some("c-7".into())), "X-Customer".into())
        );
        assert_eq!(from.pick("email", &json!({}), |_| None), Ok(None));
        let e = from
            .pick("email", &json!({}), |_| Some("a/b".into()))
            .unwrap_err();
        assert!(
            e.to_string().contains(
                "key_from = \"header:X-Customer\" found a text that is no valid key (contains '/'"
            ),
            "{e}"
        );
    }

    #[test]
    fn rate_limits_parse_print_back_or_say_the_right_form() {
        let r: RateLimit = "100/1m".parse().unwrap();
        assert_eq!((r.starts, r.window), (100, Duration::from_secs(60)));
        assert_eq!(r.to_string(), "100/1m");
        assert_eq!(
            "20 / 10s".parse::<RateLimit>().unwrap().window,
            Duration::from_secs(10)
        );
        let e = "100 per minute".parse::<RateLimit>().unwrap_err();
        assert!(e.contains("has no '/'") && e.contains("\"100/1m\""), "{e}");
        for bad in [
            "0/1s",
            "5/lots",
            "x/1s",
            "1000001/1s",
            "1/99ms",
            "1/8d",
            "1/7d 1s",
        ] {
            assert!(bad.parse::<RateLimit>().is_err(), "{bad}");
        }
        for edge in ["1/100ms", "1000000/7d"] {
            let r: RateLimit = edge.parse().unwrap();
            assert_eq!(r.to_string().parse::<RateLimit>(), Ok(r), "{edge}");
        }
    }
}
