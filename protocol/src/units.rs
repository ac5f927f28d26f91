//! Human units shared by the server's command line and config, the rules
//! file, and clients: rates, durations and byte sizes.
//!
//! Rates read as `COUNT/PERIOD`: `5/s`, `100/min`, `10000/day`, `50/10s`.
//! Durations read as `250ms`, `60s`, `1h` (humantime's syntax). Both parse
//! into whole milliseconds, the protocol's unit, and refuse zero, negative,
//! fractional and non-numeric input with a message that says what was wrong.
//! One parser for everyone, so `"5/s"` means the same to `tollgate check
//! --rate`, a rules file and `Rate::from_str` in a gateway.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// `count` events per `period_ms` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub count: u64,
    pub period_ms: u64,
}

impl Rate {
    /// `count` per `period` (whole milliseconds; a sub-millisecond part is
    /// dropped, and a period under 1 ms counts as 1 ms).
    pub fn new(count: u64, period: Duration) -> Self {
        Self {
            count,
            period_ms: duration_ms(period).max(1),
        }
    }

    /// `count` per second.
    pub const fn per_second(count: u64) -> Self {
        Self {
            count,
            period_ms: 1_000,
        }
    }

    /// `count` per minute.
    pub const fn per_minute(count: u64) -> Self {
        Self {
            count,
            period_ms: 60_000,
        }
    }

    /// `count` per hour.
    pub const fn per_hour(count: u64) -> Self {
        Self {
            count,
            period_ms: 3_600_000,
        }
    }

    /// `count` per day.
    pub const fn per_day(count: u64) -> Self {
        Self {
            count,
            period_ms: 86_400_000,
        }
    }

    /// The period as a `Duration`.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }
}

/// Whole milliseconds of `d`, saturating at `u64::MAX`.
pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("rate {0:?} must look like COUNT/PERIOD, e.g. 5/s, 100/min, 10000/day")]
    RateShape(String),
    #[error("rate count {0:?} must be a whole number of at least 1")]
    RateCount(String),
    #[error("duration {input:?}: {reason}")]
    Duration { input: String, reason: String },
    #[error("duration {0:?} must be at least 1ms and a whole number of milliseconds")]
    DurationRange(String),
    #[error("size {0:?} must look like 1048576, 512KiB, 64MiB, 1GiB or 2GB")]
    Bytes(String),
}

impl FromStr for Rate {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (count, period) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| UnitError::RateShape(s.to_owned()))?;
        let count = count.trim();
        // Digits only: refuses "-5", "+5", "5.5", "NaN", "inf".
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(UnitError::RateCount(count.to_owned()));
        }
        let count: u64 = count
            .parse()
            .ok()
            .filter(|&c| c >= 1)
            .ok_or_else(|| UnitError::RateCount(count.to_owned()))?;
        let period = period.trim();
        let period_ms = match period {
            "ms" => 1,
            "s" | "sec" | "second" => 1_000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            "d" | "day" => 86_400_000,
            other => parse_millis(other)?,
        };
        Ok(Rate { count, period_ms })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}ms", self.count, self.period_ms)
    }
}

/// Parses a byte size: `1048576`, `512KiB`, `64MiB`, `1GiB`, `2GB` (decimal
/// units are powers of 1000, binary ones of 1024).
pub fn parse_bytes(s: &str) -> Result<usize, UnitError> {
    let t = s.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = t.split_at(digits);
    let bad = || UnitError::Bytes(s.to_owned());
    let number: u64 = number.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return Err(bad()),
    };
    number
        .checked_mul(scale)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(bad)
}

/// Parses a human duration into whole milliseconds (>= 1).
pub fn parse_millis(s: &str) -> Result<u64, UnitError> {
    let d = parse_duration(s)?;
    if d.subsec_nanos() % 1_000_000 != 0 || d.is_zero() {
        return Err(UnitError::DurationRange(s.to_owned()));
    }
    u64::try_from(d.as_millis()).map_err(|_| UnitError::DurationRange(s.to_owned()))
}

/// Parses a human duration (`250ms`, `60s`, `5m`); zero is allowed here.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    humantime::parse_duration(s.trim()).map_err(|e| UnitError::Duration {
        input: s.to_owned(),
        reason: e.to_string(),
    })
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        s.parse().unwrap()
    }

    #[test]
    fn rates() {
        assert_eq!(
            rate("5/s"),
            Rate {
                count: 5,
                period_ms: 1000
            }
        );
        assert_eq!(
            rate("100/min"),
            Rate {
                count: 100,
                period_ms: 60_000
            }
        );
        assert_eq!(
            rate("10000/day"),
            Rate {
                count: 10_000,
                period_ms: 86_400_000
            }
        );
        assert_eq!(
            rate("50/10s"),
            Rate {
                count: 50,
                period_ms: 10_000
            }
        );
        assert_eq!(
            rate("3/250ms"),
            Rate {
                count: 3,
                period_ms: 250
            }
        );
        assert_eq!(
            rate(" 7 / h "),
            Rate {
                count: 7,
                period_ms: 3_600_000
            }
        );
    }

    #[test]
    fn bad_rates_say_why() {
        for bad in [
            "0/s",
            "-5/s",
            "NaN/s",
            "inf/s",
            "5.5/s",
            "/s",
            "5",
            "5/",
            "5/0s",
            "5/fortnight",
            "99999999999999999999999/s",
        ] {
            let err = bad.parse::<Rate>().unwrap_err();
            assert!(!err.to_string().is_empty(), "{bad}");
        }
        assert!(matches!(
            "0/s".parse::<Rate>(),
            Err(UnitError::RateCount(_))
        ));
        assert!(matches!(
            "5/0s".parse::<Rate>(),
            Err(UnitError::DurationRange(_))
        ));
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("2 GB").unwrap(), 2_000_000_000);
        for bad in ["", "GiB", "-1GiB", "1.5GiB", "1 parsec", "99999999999TiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_millis("250ms").unwrap(), 250);
        assert_eq!(parse_millis("60s").unwrap(), 60_000);
        assert_eq!(parse_millis("1h 30m").unwrap(), 5_400_000);
        assert!(parse_millis("0s").is_err());
        assert!(parse_millis("1500us").is_err());
        assert!(parse_millis("-1s").is_err());
        assert!(parse_millis("soon").is_err());
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
    }
}
