//! The crate's own small macros (textually scoped: `lib.rs` declares this module first).

/// Reads and writes a setting through its text form: for a type with `FromStr<Err = String>`
/// and `Display`, the conversions `#[serde(try_from = "String", into = "String")]` needs.
macro_rules! text_form {
    ($($t:ty),+ $(,)?) => {$(
        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(text: String) -> Result<Self, String> {
                text.parse()
            }
        }

        impl From<$t> for String {
            fn from(value: $t) -> String {
                value.to_string()
            }
        }
    )+};
}
