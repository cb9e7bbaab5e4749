//! Liveness rules, kept pure so they are unit tested: which earlier incarnation of this host
//! is gone (start-up reconciliation), and when a worker must fence itself off.
//!
//! A process is identified by (boot id, pid, start time in clock ticks since boot): a pid
//! alone is reused — after a container restart the new worker is often pid 1 again, exactly
//! like the one that died — but a pid with the same start time on the same boot is the same
//! process. A heartbeat is no help here: the dead incarnation's last beat is seconds old.

use crate::store::Incarnation;
use std::time::Duration;

/// This machine's boot id (Linux), e.g. "3c1f…".
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// This process's pid namespace, e.g. "pid:[4026531836]": pids are only comparable within it.
pub fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Start time of process `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), or
/// None when no such process exists.
pub fn proc_start(pid: i32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_start(&stat)
}

/// Field 22 of a /proc/<pid>/stat line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its closing parenthesis.
pub fn parse_proc_start(stat: &str) -> Option<i64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state): field 22 is the 20th from here.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Is `other`, an incarnation registered under this worker's hostname, still running?
///
/// - Another boot id: the host rebooted, or — with StatefulSet identities, where Kubernetes
///   never runs two pods of one name at once — the pod was replaced: gone.
/// - Same boot and pid namespace: alive exactly when a process with its pid and start time
///   exists.
/// - Same boot, another pid namespace (two containers with one hostname on one kernel), or
///   an unknown identity: its pid cannot be probed from here, so it is treated as alive; the
///   heartbeat reaper recovers its jobs if it is not.
pub fn incarnation_alive(
    other: &Incarnation,
    my_boot: Option<&str>,
    my_pid_ns: Option<&str>,
    probe: impl Fn(i32) -> Option<i64>,
) -> bool {
    match (other.boot_id.as_deref(), my_boot, other.proc_start) {
        (Some(theirs), Some(mine), _) if theirs != mine => false,
        (Some(_), Some(_), Some(start)) if other.pid_ns.as_deref() == my_pid_ns => {
            probe(other.pid) == Some(start)
        }
        _ => true,
    }
}

/// A worker that has not renewed its heartbeat for this long must stop its handlers: others
/// are about to declare it dead and take its jobs (one beat of margin before `dead_after`).
pub fn must_self_fence(
    since_last_beat: Duration,
    dead_after: Duration,
    heartbeat_every: Duration,
) -> bool {
    since_last_beat >= dead_after.saturating_sub(heartbeat_every)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inc(boot: Option<&str>, pid: i32, start: Option<i64>) -> Incarnation {
        Incarnation {
            id: "host-1-aaaa".into(),
            pid,
            boot_id: boot.map(str::to_string),
            proc_start: start,
            pid_ns: Some("pid:[1]".into()),
        }
    }

    #[test]
    fn same_pid_and_start_on_this_boot_is_alive() {
        let probe = |pid| (pid == 42).then_some(1000);
        assert!(incarnation_alive(
            &inc(Some("b"), 42, Some(1000)),
            Some("b"),
            Some("pid:[1]"),
            probe
        ));
    }

    #[test]
    fn reused_pid_is_not_the_same_process() {
        // pid 1 again after a container restart: another start time.
        let probe = |_| Some(5000);
        assert!(!incarnation_alive(
            &inc(Some("b"), 1, Some(1000)),
            Some("b"),
            Some("pid:[1]"),
            probe
        ));
    }

    #[test]
    fn vanished_pid_is_dead() {
        assert!(!incarnation_alive(
            &inc(Some("b"), 42, Some(1000)),
            Some("b"),
            Some("pid:[1]"),
            |_| None
        ));
    }

    #[test]
    fn another_boot_is_dead_and_unknown_identity_is_left_alone() {
        assert!(!incarnation_alive(
            &inc(Some("old"), 42, Some(1)),
            Some("new"),
            Some("pid:[1]"),
            |_| Some(1)
        ));
        assert!(incarnation_alive(
            &inc(None, 42, None),
            Some("b"),
            Some("pid:[1]"),
            |_| None
        ));
    }

    #[test]
    fn another_pid_namespace_cannot_be_probed_so_it_is_left_alone() {
        let other = inc(Some("b"), 42, Some(1000));
        assert!(incarnation_alive(
            &other,
            Some("b"),
            Some("pid:[2]"),
            |_| None
        ));
    }

    #[test]
    fn parses_stat_lines_with_odd_command_names() {
        let line = "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 12345 67 18446744073709551615";
        assert_eq!(parse_proc_start(line), Some(987654));
        let me = proc_start(std::process::id() as i32);
        assert!(me.is_some_and(|t| t > 0));
    }

    #[test]
    fn self_fence_one_beat_before_dead() {
        let (dead, beat) = (Duration::from_secs(15), Duration::from_secs(5));
        assert!(!must_self_fence(Duration::from_secs(9), dead, beat));
        assert!(must_self_fence(Duration::from_secs(10), dead, beat));
    }
}
