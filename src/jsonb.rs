//! What PostgreSQL's `jsonb` can store. It cannot hold the NUL character (`\u0000`) in any
//! string or key; a value that has one fails at insert time. Shared by message decoding
//! (a payload is rejected with a reason) and settling (a result or error is cleaned).

use serde_json::Value;

/// Does `v` hold a NUL character anywhere (strings and object keys)?
pub fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(has_nul),
        Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// `s` with every NUL replaced by U+FFFD, so PostgreSQL's text and jsonb accept it.
pub fn clean_text(s: String) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{FFFD}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nul_in_strings_and_keys() {
        assert!(has_nul(&serde_json::json!({"a": ["x\u{0}"]})));
        assert!(has_nul(&serde_json::json!({"k\u{0}": 1})));
        assert!(!has_nul(&serde_json::json!({"a": [1, "b"]})));
        assert_eq!(clean_text("a\0b".into()), "a\u{FFFD}b");
    }
}
