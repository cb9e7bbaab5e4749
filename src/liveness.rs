//! Liveness rules, kept pure so they are unit tested: which earlier incarnation of this host
//! is provably gone (start-up reconciliation), and when a worker must fence itself off.
//!
//! A process is identified by (boot id, pid namespace, pid, start time in clock ticks since
//! boot): a pid alone is reused — after a container restart the new worker is often pid 1
//! again, exactly like the one that died — but a pid with the same start time on the same
//! boot, in the same pid namespace, is the same process.
//!
//! **Only proof of death lets start-up reconciliation take jobs at once.** The proof is a
//! look at this kernel's process table in the owner's own pid namespace: no process with that
//! pid and start time, or only a zombie (it exited and waits to be reaped). Anything else —
//! another boot id (another node, or a rebooted one), another pid namespace, an identity not
//! recorded — proves nothing: two live processes can share a host name (a shared
//! `worker.hostname`, a force-deleted StatefulSet pod still running on a partitioned node).
//! Those owners are judged by their heartbeat alone, by the heartbeat reaper, against the
//! `dead_after` they declared.

use std::time::Duration;

/// Another registered incarnation of this hostname, as its `workers` row describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Incarnation {
    pub id: String,
    pub pid: i32,
    pub boot_id: Option<String>,
    pub proc_start: Option<i64>,
    pub pid_ns: Option<String>,
}

/// What this kernel says of a pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcState {
    /// Start time in clock ticks since boot.
    pub start: i64,
    /// Exited and waiting to be reaped (`Z`), or being torn down (`X`).
    pub exited: bool,
}

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
    proc_state(pid).map(|s| s.start)
}

/// What /proc says of `pid`, or None when no such process exists.
pub fn proc_state(pid: i32) -> Option<ProcState> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat(&stat)
}

/// State (field 3) and start time (field 22) of a /proc/<pid>/stat line. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after its closing
/// parenthesis.
pub fn parse_proc_stat(stat: &str) -> Option<ProcState> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    // `rest` starts at field 3 (state): field 22 is the 19th after it.
    let start = fields.nth(18)?.parse().ok()?;
    Some(ProcState {
        start,
        exited: matches!(state, "Z" | "X" | "x"),
    })
}

/// Is `other`, an incarnation registered under this worker's hostname, provably gone?
///
/// Gone exactly when it ran on this boot, in this pid namespace, and the process table has
/// no live process with its pid and start time (none at all, another one reusing the pid, or
/// only its zombie). Every other case is not proof, and its jobs are left to the heartbeat
/// reaper.
pub fn incarnation_gone(
    other: &Incarnation,
    my_boot: Option<&str>,
    my_pid_ns: Option<&str>,
    probe: impl Fn(i32) -> Option<ProcState>,
) -> bool {
    let (Some(theirs), Some(mine)) = (other.boot_id.as_deref(), my_boot) else {
        return false;
    };
    let Some(start) = other.proc_start else {
        return false;
    };
    if theirs != mine || other.pid_ns.is_none() || other.pid_ns.as_deref() != my_pid_ns {
        return false;
    }
    match probe(other.pid) {
        None => true,
        Some(p) if p.start != start => true,
        Some(p) => p.exited,
    }
}

/// How a worker paces its heartbeat and when it must fence itself off, derived from the two
/// settings it declares (`heartbeat_every`, `dead_after`). The derivation:
///
/// - Others declare the worker dead `dead_after` after the last beat the database recorded
///   (`heartbeat_at`, stamped when the beat's statement started, which is no earlier than
///   when the worker sent it). The worker measures its silence from when it *sent* its last
///   successful beat, so its own clock never runs behind the reapers'.
/// - It must have stopped every handler before anyone may take its jobs: it fences at
///   `fence_after = dead_after − stop_margin`, leaving `stop_margin = dead_after / 3` to stop
///   them (exec handlers get at most half of it between SIGTERM and SIGKILL, see
///   [`Pacing::stop_grace`]).
/// - A beat is never abandoned while it waits (a 3 s lock on the workers table delays it,
///   and when it lands it still counts from when it was sent); a beat that fails is retried
///   after `retry_every` rather than a whole interval later.
/// - With `dead_after ≥ 2 × heartbeat_every` (the configuration's rule), `fence_after ≥
///   4/3 × heartbeat_every`: a healthy worker beats well inside it, and one slow or failed
///   beat leaves room for the next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    pub heartbeat_every: Duration,
    pub dead_after: Duration,
}

impl Pacing {
    /// Time reserved, before others may declare the worker dead, to stop its handlers.
    pub fn stop_margin(&self) -> Duration {
        self.dead_after / 3
    }

    /// Silence (since the last successful beat was sent) after which the worker stops all
    /// its handlers and takes no work.
    pub fn fence_after(&self) -> Duration {
        self.dead_after - self.stop_margin()
    }

    /// Wait before retrying a beat that failed.
    pub fn retry_every(&self) -> Duration {
        (self.heartbeat_every / 4).max(Duration::from_millis(50))
    }

    /// SIGTERM→SIGKILL grace for an exec handler stopped because its job was lost or the
    /// worker fenced itself off: at most half the stop margin, so the process group is gone
    /// before the job can run elsewhere.
    pub fn stop_grace(&self, normal: Duration) -> Duration {
        normal.min(self.stop_margin() / 2)
    }

    /// Must a worker silent for `silence` fence itself off?
    pub fn must_fence(&self, silence: Duration) -> bool {
        silence >= self.fence_after()
    }
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

    fn running(start: i64) -> Option<ProcState> {
        Some(ProcState {
            start,
            exited: false,
        })
    }

    #[test]
    fn same_pid_and_start_on_this_boot_is_alive() {
        let probe = |pid| if pid == 42 { running(1000) } else { None };
        assert!(!incarnation_gone(
            &inc(Some("b"), 42, Some(1000)),
            Some("b"),
            Some("pid:[1]"),
            probe
        ));
    }

    #[test]
    fn reused_pid_is_not_the_same_process() {
        // pid 1 again after a container restart: another start time.
        assert!(incarnation_gone(
            &inc(Some("b"), 1, Some(1000)),
            Some("b"),
            Some("pid:[1]"),
            |_| running(5000)
        ));
    }

    #[test]
    fn vanished_pid_and_zombie_are_gone() {
        assert!(incarnation_gone(
            &inc(Some("b"), 42, Some(1000)),
            Some("b"),
            Some("pid:[1]"),
            |_| None
        ));
        // Killed, not yet reaped by its parent: same pid and start time, state Z.
        assert!(incarnation_gone(
            &inc(Some("b"), 42, Some(1000)),
            Some("b"),
            Some("pid:[1]"),
            |_| Some(ProcState {
                start: 1000,
                exited: true
            })
        ));
    }

    #[test]
    fn another_boot_is_no_proof_nor_is_an_unknown_identity() {
        // Another node (or a force-deleted pod still running elsewhere): left to the reaper.
        assert!(!incarnation_gone(
            &inc(Some("old"), 42, Some(1)),
            Some("new"),
            Some("pid:[1]"),
            |_| None
        ));
        assert!(!incarnation_gone(
            &inc(None, 42, None),
            Some("b"),
            Some("pid:[1]"),
            |_| None
        ));
    }

    #[test]
    fn another_pid_namespace_cannot_be_probed_so_it_is_no_proof() {
        let other = inc(Some("b"), 42, Some(1000));
        assert!(!incarnation_gone(
            &other,
            Some("b"),
            Some("pid:[2]"),
            |_| None
        ));
    }

    #[test]
    fn parses_stat_lines_with_odd_command_names() {
        let line = "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 12345 67 18446744073709551615";
        assert_eq!(
            parse_proc_stat(line),
            Some(ProcState {
                start: 987654,
                exited: false
            })
        );
        let zombie = "77 (jobwarden) Z 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 5555 0 0 0";
        assert_eq!(parse_proc_stat(zombie).map(|p| p.exited), Some(true));
        let me = proc_start(std::process::id() as i32);
        assert!(me.is_some_and(|t| t > 0));
    }

    #[test]
    fn fence_margins_are_derived_from_the_declared_settings() {
        let p = Pacing {
            heartbeat_every: Duration::from_secs(5),
            dead_after: Duration::from_secs(15),
        };
        assert_eq!(p.fence_after(), Duration::from_secs(10));
        assert_eq!(p.stop_margin(), Duration::from_secs(5));
        assert!(!p.must_fence(Duration::from_millis(9_999)));
        assert!(p.must_fence(Duration::from_secs(10)));
        // A beat held 3 s by a lock still lands inside the fence: 5 s interval + 3 s.
        assert!(!p.must_fence(Duration::from_secs(8)));
        assert_eq!(
            p.stop_grace(Duration::from_secs(5)),
            Duration::from_millis(2500)
        );
        // The smallest allowed dead_after: a healthy beat (one interval plus latency) is
        // well inside the fence.
        let tight = Pacing {
            heartbeat_every: Duration::from_secs(1),
            dead_after: Duration::from_secs(2),
        };
        assert!(tight.fence_after() > Duration::from_millis(1300));
        assert!(!tight.must_fence(Duration::from_millis(1200)));
        assert_eq!(tight.retry_every(), Duration::from_millis(250));
    }

    #[test]
    fn this_machines_boot_id_and_pid_namespace_are_read_from_the_kernel() {
        // The identity start-up reconciliation compares: a boot id is a UUID (read without
        // its newline), a pid namespace is named like "pid:[4026531836]".
        let boot = boot_id().expect("Linux has /proc/sys/kernel/random/boot_id");
        let groups: Vec<usize> = boot.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{boot:?}");
        assert!(
            boot.chars().all(|c| c == '-' || c.is_ascii_hexdigit()),
            "{boot:?}"
        );
        assert_eq!(
            boot_id().as_deref(),
            Some(boot.as_str()),
            "the same on every read"
        );
        let ns = pid_namespace().expect("Linux has /proc/self/ns/pid");
        let inode = ns
            .strip_prefix("pid:[")
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or_else(|| panic!("{ns:?}"));
        assert!(inode.parse::<u64>().is_ok(), "{ns:?}");
    }

    #[test]
    fn the_process_table_tells_a_running_child_its_zombie_and_its_absence_apart() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mine = proc_start(std::process::id() as i32).unwrap();
        let running = proc_state(pid).expect("the child runs");
        assert!(!running.exited);
        assert!(
            running.start >= mine,
            "started after us: {running:?} vs {mine}"
        );
        // Killed and not reaped yet: a zombie, with the same start time.
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !proc_state(pid).is_some_and(|p| p.exited) {
            assert!(std::time::Instant::now() < deadline, "never seen exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(proc_start(pid), Some(running.start));
        child.wait().unwrap();
        // Reaped: no process with that pid and start time (the pid may be reused already).
        assert!(
            proc_state(pid).is_none_or(|p| p.start != running.start),
            "still there after it was reaped"
        );
        assert_eq!(proc_start(i32::MAX), None, "beyond any pid_max");
    }
}
