//! Reading the merged file and environment into a [`Config`]: every value of the wrong type
//! or form is reported at once, each named by its setting, and a secret's value never.

use super::{is_secret_setting, Config};
use figment::error::Kind;
use figment::providers::Serialized;
use figment::value::Dict;
use figment::Figment;

/// Most load errors reported for one configuration.
const MOST_ERRORS: usize = 100;

/// The configuration, or every value that cannot be read. serde stops at the first value it
/// cannot read: that value is taken out of the merged data (so its default applies) and the
/// rest read again, until it reads or an error has nothing to take out (a missing field,
/// a file that does not parse). Rules relating settings to each other are checked only
/// once every value reads (see `Config::validate`).
pub(super) fn extract_all(fig: &Figment) -> Result<Config, Vec<figment::Error>> {
    let mut errors: Vec<figment::Error> = match fig.extract::<Config>() {
        Ok(config) => return Ok(config),
        Err(e) => e.into_iter().collect(),
    };
    let Ok(mut data) = fig.extract::<Dict>() else {
        return Err(errors);
    };
    let mut taken_out: Vec<Vec<String>> = Vec::new();
    let mut next = errors.last().map(|e| e.path.clone());
    while let Some(path) = next.take() {
        if errors.len() >= MOST_ERRORS || !remove(&mut data, &path) {
            break;
        }
        taken_out.push(path);
        let Err(e) = Figment::from(Serialized::defaults(&data)).extract::<Config>() else {
            break;
        };
        for e in e {
            // A required value taken out above is missing now: its table goes too, and
            // the error already said what is wrong with it.
            if let Kind::MissingField(field) = &e.kind {
                let mut whole = e.path.clone();
                whole.push(field.to_string());
                if taken_out.contains(&whole) {
                    next = Some(e.path);
                    continue;
                }
            }
            next = Some(e.path.clone());
            errors.push(e);
        }
    }
    Err(errors)
}

/// Takes the value at `path` out of `data`; false when there is none.
fn remove(data: &mut Dict, path: &[String]) -> bool {
    match path {
        [] => false,
        [last] => data.remove(last).is_some(),
        [first, rest @ ..] => match data.get_mut(first) {
            Some(figment::value::Value::Dict(_, inner)) => remove(inner, rest),
            _ => false,
        },
    }
}

/// One load error as a line: the setting's path and what is wrong with it. For a secret
/// setting the value is left out; a TOML syntax error keeps its line and column but not the
/// quoted line of the file (it may hold a secret).
pub(super) fn describe_load_error(e: &figment::Error) -> String {
    use figment::error::{Actual, Kind};
    let path = e.path.join(".");
    let hint = if matches!(e.kind, Kind::UnknownField(..)) {
        " (check the spelling against examples/jobwarden.toml)"
    } else {
        ""
    };
    if path.is_empty() {
        return format!("{}{hint}", without_source_lines(&e.to_string()));
    }
    if !is_secret_setting(&path) {
        return format!("{path}: {}{hint}", e.kind);
    }
    let key = e.path.last().map(String::as_str).unwrap_or("");
    match &e.kind {
        Kind::InvalidType(actual, expected) => {
            let found = match actual {
                Actual::Unsigned(_) | Actual::Signed(_) | Actual::Float(_) => "a number",
                Actual::Bool(_) => "a boolean",
                Actual::Seq => "a list",
                Actual::Map => "a table",
                _ => "a value of another type",
            };
            format!(
                "{path}: found {found} where {expected} belongs; quote it, e.g. {key} = \"…\" \
                 (the value is not shown: this setting holds a secret)"
            )
        }
        _ => format!(
            "{path}: not a valid value (not shown: this setting holds a secret); give a quoted \
             string, e.g. {key} = \"…\""
        ),
    }
}

/// A parser's message without the lines that quote the source (`  |`, `3 | password = …`).
fn without_source_lines(message: &str) -> String {
    message
        .lines()
        .filter(|l| {
            let t = l
                .trim_start()
                .trim_start_matches(|c: char| c.is_ascii_digit());
            !t.trim_start().starts_with('|')
        })
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The secrets given to a configuration that did not load (so [`Config::secrets`] cannot
/// be asked): the values found at the secret settings, whatever their type.
pub(super) fn raw_secrets(fig: &Figment) -> crate::redact::Secrets {
    use figment::value::Value;
    let mut secrets = crate::redact::Secrets::new();
    fn walk(path: &str, v: &Value, secrets: &mut crate::redact::Secrets) {
        match v {
            Value::Dict(_, dict) => {
                for (k, v) in dict {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&sub, v, secrets);
                }
            }
            _ if !is_secret_setting(path) => {}
            Value::String(_, s) if path.ends_with("url") => {
                secrets.add_url(s);
            }
            Value::String(_, s) => {
                secrets.add(s);
            }
            Value::Num(_, n) => {
                let text = n
                    .to_u128()
                    .map(|n| n.to_string())
                    .or_else(|| n.to_i128().map(|n| n.to_string()))
                    .or_else(|| n.to_f64().map(|n| n.to_string()))
                    .unwrap_or_default();
                secrets.add(&text);
            }
            _ => {}
        }
    }
    // Every profile's merged values (the file and the environment fill the default one).
    if let Ok(profiles) = figment::Provider::data(fig) {
        for dict in profiles.values() {
            for (k, v) in dict {
                walk(k, v, &mut secrets);
            }
        }
    }
    secrets
}
