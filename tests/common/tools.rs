//! External tools a test needs besides the servers (Chromium and chromedriver, the
//! deployment validators): found, or the test stops — failing in CI, skipping loudly
//! elsewhere. Every test that needs such a tool asks [`require_tool`], so the rule is kept in
//! one place: a CI run is never green because a check did not run.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// True when the `CI` environment variable says this is a CI run: set, not empty, and
/// neither `false` nor `0` (what CI services and `.ci/run`'s caller set).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| ci_value_means_ci(&v))
}

/// [`in_ci`] for the value `v` of `CI`.
pub fn ci_value_means_ci(v: &str) -> bool {
    let v = v.trim();
    !v.is_empty() && !v.eq_ignore_ascii_case("false") && v != "0"
}

/// The executable `name` at `path`, which is the one place it is looked for. When it is not
/// there (or not executable): in CI the test fails, naming the tool, the path and `install`,
/// the exact command that installs it; elsewhere one line `SKIPPED: <test>: …` goes to
/// stderr (past the harness' output capture, so a plain `cargo test` shows it) and the
/// answer is `None`, on which the caller returns.
#[track_caller]
pub fn require_tool(name: &str, path: &Path, install: &str) -> Option<PathBuf> {
    require_tool_as(in_ci(), name, path, install)
}

/// [`require_tool`] as in CI or not (`ci`), whatever the environment says.
#[track_caller]
pub fn require_tool_as(ci: bool, name: &str, path: &Path, install: &str) -> Option<PathBuf> {
    if is_executable(path) {
        return Some(path.to_path_buf());
    }
    let why = format!(
        "{name} is missing: looked for {} (no executable file there); install it with: {install}",
        path.display()
    );
    if ci {
        panic!(
            "{why}\n(CI={:?}: in CI a missing tool fails the test instead of skipping it)",
            std::env::var("CI").unwrap_or_default()
        );
    }
    let test = std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .map(|n| format!("{n}: "))
        .unwrap_or_default();
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {test}{why} (in CI, with CI=true, this fails)"
    );
    None
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
