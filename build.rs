//! Build steps:
//! - The migrations are embedded at compile time (refinery's `embed_migrations!`), which cargo
//!   cannot see: rebuild when a file in migrations/ is added or changed.
//! - Every statement file in `src/store/sql/` becomes a constant of `store::sql` (its name in
//!   capitals) and an entry of `store::sql::ALL`, which a test prepares against the migrated
//!   schema. Listed here, from the directory, so no statement can be left out by hand.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=src/store/sql");
    let dir = Path::new("src/store/sql");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read src/store/sql")
        .map(|e| e.expect("read src/store/sql").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_str().expect("a UTF-8 file name");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "src/store/sql/{name}.sql: a statement file is named in lower case, digits and \
                 underscores (it becomes a constant)"
            );
            name.to_string()
        })
        .collect();
    names.sort();
    let mut out = String::new();
    for n in &names {
        writeln!(
            out,
            "/// `src/store/sql/{n}.sql`.\npub const {}: &str = \
             include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/src/store/sql/{n}.sql\"));",
            n.to_uppercase()
        )
        .unwrap();
    }
    writeln!(out, "/// Every statement file: (name, text).").unwrap();
    writeln!(out, "pub const ALL: &[(&str, &str)] = &[").unwrap();
    for n in &names {
        writeln!(out, "    (\"{n}\", {}),", n.to_uppercase()).unwrap();
    }
    writeln!(out, "];").unwrap();
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("sql.rs");
    std::fs::write(dest, out).expect("write sql.rs");
}
