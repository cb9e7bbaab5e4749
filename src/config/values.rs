//! Setting values written as text in the file and parsed once, at load: an address to
//! listen on, a listener that may be off, a rate limit. Each keeps its text form for
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

text_form!(ListenAddr, Listen, RateLimit, KeepFor);

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
