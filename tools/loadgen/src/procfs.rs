//! What `/proc` tells about a process: CPU time (all threads) and resident memory. Linux only.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::LoadgenError;

/// Clock ticks per second (`getconf CLK_TCK`, read once; 100 when `getconf` is unavailable, the
/// value of every mainstream Linux build).
pub fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t: &u64| *t > 0)
        .unwrap_or(100)
}

/// `utime + stime` (clock ticks) from the text of `/proc/<pid>/stat`. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
pub fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// The thread name of a `/proc/<pid>/task/<tid>/stat` line (its `comm`, between parentheses).
pub fn parse_comm(stat: &str) -> Option<&str> {
    let start = stat.find('(')? + 1;
    let end = stat.rfind(')')?;
    stat.get(start..end)
}

/// A thread name without its index (`capture-1` → `capture`), so that a pool's threads add up.
pub fn thread_kind(name: &str) -> String {
    name.trim_end_matches(|c: char| c.is_ascii_digit())
        .trim_end_matches('-')
        .to_owned()
}

/// Per thread kind, the CPU ticks between two [`Proc::thread_ticks`] readings: a thread in both
/// counts its growth, a new one all it has; `exited` is what the process spent beyond that (threads
/// that ended between the readings, such as idle blocking-pool threads).
pub fn thread_growth(
    before: &BTreeMap<u32, (String, u64)>,
    after: &BTreeMap<u32, (String, u64)>,
    process_ticks: u64,
) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (tid, (kind, ticks)) in after {
        let was = before.get(tid).map_or(0, |(_, t)| *t);
        *out.entry(kind.clone()).or_default() += ticks.saturating_sub(was);
    }
    let seen: u64 = out.values().sum();
    out.insert("exited".to_owned(), process_ticks.saturating_sub(seen));
    out
}

/// CPU time and memory readings of one process.
#[derive(Debug, Clone, Copy)]
pub struct Proc {
    pub pid: u32,
    pub ticks_per_second: u64,
}

impl Proc {
    /// This process (the load generator).
    pub fn current(ticks_per_second: u64) -> Self {
        Self {
            pid: std::process::id(),
            ticks_per_second,
        }
    }

    fn read(&self, file: &str) -> Result<String, LoadgenError> {
        let path = format!("/proc/{}/{file}", self.pid);
        std::fs::read_to_string(&path).map_err(|source| LoadgenError::Io {
            context: format!("reading {path}"),
            source,
        })
    }

    /// User + system CPU time of every thread, in clock ticks.
    pub fn cpu_ticks(&self) -> Result<u64, LoadgenError> {
        let stat = self.read("stat")?;
        parse_stat_ticks(&stat).ok_or_else(|| LoadgenError::Proc {
            pid: self.pid,
            detail: "cannot read utime/stime from /proc/<pid>/stat".into(),
        })
    }

    /// User + system CPU time of each live thread, in clock ticks, by thread id, with the thread's
    /// name (`comm`). A thread that exits between two readings is missing from the second.
    pub fn thread_ticks(&self) -> Result<BTreeMap<u32, (String, u64)>, LoadgenError> {
        let dir = format!("/proc/{}/task", self.pid);
        let entries = std::fs::read_dir(&dir).map_err(|source| LoadgenError::Io {
            context: format!("reading {dir}"),
            source,
        })?;
        let mut out = BTreeMap::new();
        for entry in entries.flatten() {
            let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<u32>().ok())
            else {
                continue;
            };
            // A thread may exit between the listing and the read: skipped.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let (Some(name), Some(ticks)) = (parse_comm(&stat), parse_stat_ticks(&stat)) {
                out.insert(tid, (thread_kind(name), ticks));
            }
        }
        Ok(out)
    }

    /// `ticks` as seconds.
    pub fn seconds(&self, ticks: u64) -> f64 {
        ticks as f64 / self.ticks_per_second as f64
    }

    /// (current RSS, peak RSS) in KiB.
    pub fn rss_kib(&self) -> Result<(u64, u64), LoadgenError> {
        let status = self.read("status")?;
        let get = |key| {
            parse_status_kib(&status, key).ok_or_else(|| LoadgenError::Proc {
                pid: self.pid,
                detail: format!("no {key} line in /proc/<pid>/status"),
            })
        };
        Ok((get("VmRSS")?, get("VmHWM")?))
    }

    /// Polls the CPU time every `every` until two consecutive readings are equal (the process went
    /// idle: background work finished) or `bound` has passed. Returns the last reading and the time
    /// it took.
    pub async fn wait_idle(
        &self,
        every: Duration,
        bound: Duration,
    ) -> Result<(u64, Duration), LoadgenError> {
        let started = Instant::now();
        let mut last = self.cpu_ticks()?;
        loop {
            tokio::time::sleep(every).await;
            let now = self.cpu_ticks()?;
            if now == last || started.elapsed() >= bound {
                return Ok((now, started.elapsed()));
            }
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_add_up_by_kind_and_exited_threads_are_the_rest() {
        let stat = "42 (capture-1) S 1 2 3 4 5 6 7 8 9 10 30 12 0 0";
        assert_eq!(parse_comm(stat), Some("capture-1"));
        assert_eq!(thread_kind("capture-1"), "capture");
        assert_eq!(thread_kind("tokio-runtime-w"), "tokio-runtime-w");
        let t = |v: &[(u32, &str, u64)]| {
            v.iter()
                .map(|(tid, k, n)| (*tid, ((*k).to_owned(), *n)))
                .collect::<BTreeMap<_, _>>()
        };
        let before = t(&[(1, "capture", 10), (2, "capture", 5), (3, "tokio", 7)]);
        // Thread 3 exited; thread 4 is new.
        let after = t(&[(1, "capture", 14), (2, "capture", 6), (4, "tokio", 2)]);
        let g = thread_growth(&before, &after, 12);
        assert_eq!(g["capture"], 5);
        assert_eq!(g["tokio"], 2);
        assert_eq!(g["exited"], 5);
        assert_eq!(g.values().sum::<u64>(), 12);
    }

    #[test]
    fn stat_fields_after_the_command_name() {
        let stat = "4242 (policy (serv) 1) S 1 4242 4242 0 -1 4194560 2870 0 0 0 \
                    137 42 0 0 20 0 9 0 123456 1000 500 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(179));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn status_kib_lines() {
        let status = "Name:\tpolicy-serving\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(51234));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(40000));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn reads_this_process() {
        let me = Proc::current(clock_ticks_per_second());
        assert!(me.cpu_ticks().is_ok());
        let (rss, peak) = me.rss_kib().unwrap();
        assert!(rss > 0 && peak >= rss);
    }
}
