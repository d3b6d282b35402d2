//! `strftime_now(fmt)` for templates (Llama 3 and others print today's date), without a date crate.
//!
//! transformers calls `datetime.now().strftime(fmt)` in the server's local time zone; we always use
//! UTC (what servers in containers run with) and the C locale. Supported: `%a %A %b %B %c %d %D %e %f
//! %F %h %H %I %j %m %M %n %p %r %R %S %t %T %u %U %w %W %x %X %y %Y %z %Z %%`, and glibc's `%-d`
//! style flag that drops padding. Anything else is copied through unchanged, as glibc does.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tm {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    micros: u32,
    /// 0 = Sunday
    weekday: u32,
    /// 0-based day of the year
    yday: u32,
}

impl Tm {
    pub(crate) fn from_unix(secs: i64, micros: u32) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let is_leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let idx = usize::try_from(month.saturating_sub(1))
            .unwrap_or(0)
            .min(11);
        let yday = CUM[idx] + day - 1 + u32::from(is_leap && month > 2);
        Self {
            year,
            month,
            day,
            hour: u32::try_from(rem / 3600).unwrap_or(0),
            minute: u32::try_from(rem % 3600 / 60).unwrap_or(0),
            second: u32::try_from(rem % 60).unwrap_or(0),
            micros,
            weekday: u32::try_from((days + 4).rem_euclid(7)).unwrap_or(0),
            yday,
        }
    }

    pub(crate) fn now() -> Self {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self::from_unix(i64::try_from(d.as_secs()).unwrap_or(0), d.subsec_micros())
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 → (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

/// Formats `tm` with a C `strftime` format string.
pub(crate) fn strftime(fmt: &str, tm: &Tm) -> String {
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            if no_pad {
                out.push('-');
            }
            break;
        };
        let num = |out: &mut String, v: i64, width: usize, pad: char| {
            if no_pad {
                let _ = write!(out, "{v}");
            } else if pad == '0' {
                let _ = write!(out, "{v:0width$}");
            } else {
                let _ = write!(out, "{v:>width$}");
            }
        };
        let hour12 = match tm.hour % 12 {
            0 => 12,
            h => h,
        };
        let day_name = DAYS[usize::try_from(tm.weekday).unwrap_or(0) % 7];
        let month_name = MONTHS[usize::try_from(tm.month.saturating_sub(1)).unwrap_or(0) % 12];
        match spec {
            'a' => out.push_str(&day_name[..3]),
            'A' => out.push_str(day_name),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'B' => out.push_str(month_name),
            'c' => out.push_str(&strftime("%a %b %e %H:%M:%S %Y", tm)),
            'd' => num(&mut out, tm.day.into(), 2, '0'),
            'D' | 'x' => out.push_str(&strftime("%m/%d/%y", tm)),
            'e' => num(&mut out, tm.day.into(), 2, ' '),
            'f' => num(&mut out, tm.micros.into(), 6, '0'),
            'F' => out.push_str(&strftime("%Y-%m-%d", tm)),
            'H' => num(&mut out, tm.hour.into(), 2, '0'),
            'I' => num(&mut out, hour12.into(), 2, '0'),
            'j' => num(&mut out, (tm.yday + 1).into(), 3, '0'),
            'm' => num(&mut out, tm.month.into(), 2, '0'),
            'M' => num(&mut out, tm.minute.into(), 2, '0'),
            'n' => out.push('\n'),
            'p' => out.push_str(if tm.hour < 12 { "AM" } else { "PM" }),
            'r' => out.push_str(&strftime("%I:%M:%S %p", tm)),
            'R' => out.push_str(&strftime("%H:%M", tm)),
            'S' => num(&mut out, tm.second.into(), 2, '0'),
            't' => out.push('\t'),
            'T' | 'X' => out.push_str(&strftime("%H:%M:%S", tm)),
            'u' => num(
                &mut out,
                if tm.weekday == 0 {
                    7
                } else {
                    tm.weekday.into()
                },
                1,
                '0',
            ),
            'U' => num(&mut out, ((tm.yday + 7 - tm.weekday) / 7).into(), 2, '0'),
            'w' => num(&mut out, tm.weekday.into(), 1, '0'),
            'W' => num(
                &mut out,
                ((tm.yday + 7 - (tm.weekday + 6) % 7) / 7).into(),
                2,
                '0',
            ),
            'y' => num(&mut out, tm.year.rem_euclid(100), 2, '0'),
            'Y' => {
                let _ = write!(out, "{}", tm.year);
            }
            'z' => out.push_str("+0000"),
            'Z' => out.push_str("UTC"),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_a_known_instant() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let tm = Tm::from_unix(1_709_211_909, 42);
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", &tm), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y", &tm), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d, %I%p %j %%", &tm),
            "Thursday February 29, 01PM 060 %"
        );
        assert_eq!(
            strftime("%c|%f|%Q", &tm),
            "Thu Feb 29 13:05:09 2024|000042|%Q"
        );
        let epoch = Tm::from_unix(0, 0);
        assert_eq!(
            strftime("%a %F %T %U %W %u", &epoch),
            "Thu 1970-01-01 00:00:00 00 00 4"
        );
        let new_year = Tm::from_unix(1_704_067_200, 0); // 2024-01-01, a Monday
        assert_eq!(strftime("%a %j %U %W %e", &new_year), "Mon 001 00 01  1");
    }
}
