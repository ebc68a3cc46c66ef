//! HTTP-dates, read the way RFC 9110 §5.6.7 asks a recipient to: robustly.
//!
//! Accepted, with the zone's offset applied:
//!
//! - IMF-fixdate and what RFC 5322 parsers accept around it:
//!   `[Sun,] 6 Nov 1994 08:49:37 GMT`, a one- or two-digit day, a two- or
//!   four-digit year, a short or full month name (also before the day),
//!   optional seconds, the zone `GMT`, `UT`, `UTC`, a numeric
//!   `+hhmm`/`-hhmm`, one of RFC 5322's US zones (`EST` … `PDT`) or a
//!   military letter (UTC, as RFC 5322 §4.3 asks), and a trailing comment
//!   (`(UTC)`);
//! - the obsolete RFC 850 form, `Sunday, 06-Nov-94 08:49:37 GMT`;
//! - the asctime form, `Sun Nov  6 08:49:37 1994`.
//!
//! HTTP-dates are always in GMT, so a date that names no zone is read as
//! GMT (as Python's `email.utils` reads it too).
//!
//! A two-digit year is the one closest to the reference time: a date that
//! would be more than 50 years in the future is in the past century (RFC
//! 9110's MUST), not a fixed 1970/2069 split. A leap second (`:60`) is read
//! as the second after `:59`. Names of days and months are read whatever
//! their case, and a day name that does not match the date is not held
//! against it (the date itself is unambiguous; Python's `email.utils`, which
//! urllib3 uses, does the same). Everything else — a missing separator, an
//! unknown zone, fractional seconds, an impossible day or time — is
//! rejected.

use std::time::{Duration, SystemTime};

const SECS_PER_DAY: i64 = 86_400;
/// About 300 000 years, in seconds.
const LIMIT: i64 = 10_000_000_000_000;

/// The instant `text` names, or `None` when it is not an HTTP-date.
/// `reference` decides the century of a two-digit year.
pub(super) fn parse(text: &str, reference: SystemTime) -> Option<SystemTime> {
    let text = without_comment(text.trim());
    let (day_name, rest) = match text.split_once(',') {
        Some((name, rest)) => {
            weekday(name.trim())?;
            (true, rest)
        }
        None => (false, text),
    };
    let mut tokens = [""; 6];
    let mut count = 0;
    for token in rest.split_ascii_whitespace() {
        *tokens.get_mut(count)? = token;
        count += 1;
    }
    let fields = match (day_name, &tokens[..count]) {
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        (true, [date, time, z @ ..]) if date.contains('-') && z.len() <= 1 => {
            let mut parts = date.split('-');
            let (day, month, year) = (parts.next()?, parts.next()?, parts.next()?);
            if parts.next().is_some() {
                return None;
            }
            Fields::new(day, month, year, time, zone(z))?
        }
        // asctime: Sun Nov  6 08:49:37 1994
        (false, [name, month, day, time, year, z @ ..])
            if weekday(name).is_some() && z.len() <= 1 =>
        {
            Fields::new(day, month, year, time, zone(z))?
        }
        // IMF-fixdate / RFC 5322: [Sun,] 06 Nov 1994 08:49:37 GMT, or with
        // the month first, as Python's email.utils also reads it.
        (_, [a, b, year, time, z @ ..]) if z.len() <= 1 => {
            let (day, month) = if month_number(a).is_some() {
                (b, a)
            } else {
                (a, b)
            };
            Fields::new(day, month, year, time, zone(z))?
        }
        _ => return None,
    };
    fields.instant(reference)
}

/// The zone token, if there is one: HTTP-dates are in GMT, so a date that
/// names no zone is read as GMT.
fn zone<'a>(rest: &[&'a str]) -> &'a str {
    rest.first().copied().unwrap_or("GMT")
}

/// `text` without one trailing RFC 5322 comment: `… +0000 (UTC)`.
fn without_comment(text: &str) -> &str {
    match (text.strip_suffix(')'), text.rfind('(')) {
        (Some(_), Some(open)) => text[..open].trim_end(),
        _ => text,
    }
}

/// The parts of a date, before the century of a two-digit year is known.
#[derive(Debug)]
struct Fields {
    year: Year,
    month: u32,
    day: u32,
    /// Seconds since midnight, a leap second included.
    time: i64,
    /// The zone's offset east of UTC, in seconds.
    offset: i64,
}

#[derive(Debug, Clone, Copy)]
enum Year {
    Full(i64),
    TwoDigit(i64),
}

impl Fields {
    fn new(day: &str, month: &str, year: &str, time: &str, zone: &str) -> Option<Fields> {
        let day = digits(day, 1, 2)? as u32;
        let month = month_number(month)?;
        let year = match year.len() {
            2 => Year::TwoDigit(digits(year, 2, 2)?),
            4 => Year::Full(digits(year, 4, 4)?),
            _ => return None,
        };
        let mut parts = time.split(':');
        let hour = digits(parts.next()?, 1, 2)?;
        let minute = digits(parts.next()?, 2, 2)?;
        let second = match parts.next() {
            Some(s) => digits(s, 2, 2)?,
            None => 0,
        };
        if parts.next().is_some() || hour > 23 || minute > 59 || second > 60 || day == 0 {
            return None;
        }
        Some(Fields {
            year,
            month,
            day,
            time: hour * 3600 + minute * 60 + second,
            offset: zone_offset(zone)?,
        })
    }

    fn instant(&self, reference: SystemTime) -> Option<SystemTime> {
        let year = match self.year {
            Year::Full(y) => y,
            Year::TwoDigit(yy) => self.window(yy, reference),
        };
        if self.day > days_in_month(year, self.month) {
            return None;
        }
        let secs =
            days_from_civil(year, self.month, self.day) * SECS_PER_DAY + self.time - self.offset;
        if secs >= 0 {
            SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
        } else {
            SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
        }
    }

    /// RFC 9110 §5.6.7: the latest year ending in `yy` whose date is not more
    /// than 50 years after the reference.
    fn window(&self, yy: i64, reference: SystemTime) -> i64 {
        let (ref_year, ref_month, ref_day, ref_time) = civil(reference);
        let limit = ref_year + 50;
        let year = limit - (limit - yy).rem_euclid(100);
        if year == limit && (self.month, self.day, self.time) > (ref_month, ref_day, ref_time) {
            year - 100
        } else {
            year
        }
    }
}

/// `text` as a number, if it is `min..=max` ASCII digits.
fn digits(text: &str, min: usize, max: usize) -> Option<i64> {
    if text.len() < min || text.len() > max || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

const WEEKDAYS: [(&str, &str); 7] = [
    ("Mon", "Monday"),
    ("Tue", "Tuesday"),
    ("Wed", "Wednesday"),
    ("Thu", "Thursday"),
    ("Fri", "Friday"),
    ("Sat", "Saturday"),
    ("Sun", "Sunday"),
];

fn weekday(name: &str) -> Option<()> {
    WEEKDAYS
        .iter()
        .any(|(short, long)| name.eq_ignore_ascii_case(short) || name.eq_ignore_ascii_case(long))
        .then_some(())
}

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

/// `Nov` or `November` (RFC 5322 parsers such as Python's accept both).
fn month_number(name: &str) -> Option<u32> {
    let index = MONTHS.iter().position(|m| {
        name.eq_ignore_ascii_case(m) || m.get(..3).is_some_and(|s| name.eq_ignore_ascii_case(s))
    })?;
    u32::try_from(index + 1).ok()
}

/// A zone's offset east of UTC, in seconds.
fn zone_offset(zone: &str) -> Option<i64> {
    const NAMED: [(&str, i64); 12] = [
        ("GMT", 0),
        ("UT", 0),
        ("UTC", 0),
        ("Z", 0),
        ("EST", -5),
        ("EDT", -4),
        ("CST", -6),
        ("CDT", -5),
        ("MST", -7),
        ("MDT", -6),
        ("PST", -8),
        ("PDT", -7),
    ];
    if let Some((_, hours)) = NAMED.iter().find(|(n, _)| zone.eq_ignore_ascii_case(n)) {
        return Some(hours * 3600);
    }
    // RFC 5322 §4.3: the military zones' meaning was botched in RFC 822;
    // read them as UTC ("-0000"), as it asks.
    if let [letter] = zone.as_bytes() {
        if letter.is_ascii_alphabetic() && !letter.eq_ignore_ascii_case(&b'J') {
            return Some(0);
        }
    }
    let (sign, number) = match zone.as_bytes().first()? {
        b'+' => (1, zone.get(1..)?),
        b'-' => (-1, zone.get(1..)?),
        _ => return None,
    };
    let hhmm = digits(number, 4, 4)?;
    let (hours, minutes) = (hhmm / 100, hhmm % 100);
    if minutes > 59 {
        return None;
    }
    Some(sign * (hours * 3600 + minutes * 60))
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let (month, day) = (i64::from(month), i64::from(day));
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The UTC year, month, day and second of the day of `t` (the inverse of
/// [`days_from_civil`]).
fn civil(t: SystemTime) -> (i64, u32, u32, i64) {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
    // ±300 000 years keeps the arithmetic below far from overflowing; no
    // reference clock is that far off.
    .clamp(-LIMIT, LIMIT);
    let (days, time) = (secs.div_euclid(SECS_PER_DAY), secs.rem_euclid(SECS_PER_DAY));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both are small by construction: 1..=31 and 1..=12.
    (year, month as u32, day as u32, time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: i64) -> SystemTime {
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
        } else {
            SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
        }
    }

    /// 2026-11-30 12:00:00 UTC.
    const NOV_2026: i64 = 1_796_040_000;

    fn year_of(text: &str, reference: i64) -> i64 {
        civil(parse(text, at(reference)).expect(text)).0
    }

    #[test]
    fn a_two_digit_year_is_the_one_within_50_years_of_the_reference() {
        assert_eq!(civil(at(NOV_2026)), (2026, 11, 30, 43_200));
        // 2076-11-30 12:00 is exactly 50 years ahead: still the future.
        assert_eq!(year_of("Monday, 30-Nov-76 12:00:00 GMT", NOV_2026), 2076);
        // One second later it is more than 50 years ahead: the past century.
        assert_eq!(year_of("Monday, 30-Nov-76 12:00:01 GMT", NOV_2026), 1976);
        // httpdate's fixed split reads 69 as 2069 and 70 as 1970 whatever
        // the reference; the window moves with it.
        assert_eq!(year_of("Tuesday, 01-Jan-69 00:00:00 GMT", NOV_2026), 2069);
        assert_eq!(year_of("Wednesday, 01-Jan-70 00:00:00 GMT", NOV_2026), 2070);
        assert_eq!(year_of("Sunday, 01-Jan-77 00:00:00 GMT", NOV_2026), 1977);
        // Near the end of a century the next one is closer.
        let june_2099 = days_from_civil(2099, 6, 1) * SECS_PER_DAY;
        assert_eq!(year_of("Sunday, 01-Jan-01 00:00:00 GMT", june_2099), 2101);
        assert_eq!(year_of("Sunday, 01-Jan-99 00:00:00 GMT", june_2099), 2099);
        // The IMF form's two-digit year follows the same window.
        assert_eq!(year_of("01 Jan 77 00:00:00 GMT", NOV_2026), 1977);
        assert_eq!(year_of("01 Jan 30 00:00:00 GMT", NOV_2026), 2030);
        // A reference before 1970 works too.
        assert_eq!(year_of("01 Jan 30 00:00:00 GMT", -86_400 * 365 * 50), 1930);
    }

    #[test]
    fn a_leap_second_is_the_second_after_59() {
        let leap = parse("Sat, 31 Dec 2016 23:59:60 GMT", at(0)).unwrap();
        let next = parse("Sun, 01 Jan 2017 00:00:00 GMT", at(0)).unwrap();
        assert_eq!(leap, next);
    }

    #[test]
    fn offsets_are_applied() {
        let utc = parse("Sun, 06 Nov 1994 08:49:37 GMT", at(0)).unwrap();
        for text in [
            "Sun, 06 Nov 1994 09:49:37 +0100",
            "Sun, 06 Nov 1994 03:19:37 -0530",
            "Sat, 05 Nov 1994 23:49:37 -0900",
            "Sun, 06 Nov 1994 03:49:37 EST",
            "Sun, 06 Nov 1994 04:49:37 EDT",
            "Sun, 06 Nov 1994 08:49:37 Z",
        ] {
            assert_eq!(parse(text, at(0)), Some(utc), "{text}");
        }
    }

    #[test]
    fn a_far_off_reference_clock_does_not_overflow() {
        for reference in [
            SystemTime::UNIX_EPOCH + Duration::from_secs(u64::MAX / 2),
            at(i64::MIN / 2),
        ] {
            let _ = parse("Sunday, 06-Nov-94 08:49:37 GMT", reference);
        }
    }

    /// httpdate formats IMF-fixdates for 1970..=9999: every one reads back.
    #[test]
    fn civil_arithmetic_agrees_with_httpdate_at_the_edges() {
        for secs in [0, 951_782_400, 4_107_542_400, 253_402_300_799] {
            let t = at(secs);
            assert_eq!(parse(&httpdate::fmt_http_date(t), at(0)), Some(t));
            let (y, m, d, time) = civil(t);
            assert_eq!(days_from_civil(y, m, d) * SECS_PER_DAY + time, secs);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]

        #[test]
        fn every_imf_fixdate_httpdate_writes_reads_back(secs in 0i64..253_402_300_800) {
            let t = at(secs);
            prop_assert_eq!(parse(&httpdate::fmt_http_date(t), at(0)), Some(t));
        }

        #[test]
        fn civil_is_the_inverse_of_days_from_civil(secs in -LIMIT..LIMIT) {
            let (y, m, d, time) = civil(at(secs));
            prop_assert_eq!(days_from_civil(y, m, d) * SECS_PER_DAY + time, secs);
        }

        #[test]
        fn a_two_digit_year_is_never_more_than_50_years_ahead_or_behind(
            yy in 0i64..100,
            reference in 0i64..253_402_300_800,
        ) {
            let text = format!("01 Jan {yy:02} 00:00:00 GMT");
            let year = year_of(&text, reference);
            let ref_year = civil(at(reference)).0;
            prop_assert_eq!(year.rem_euclid(100), yy);
            prop_assert!(year <= ref_year + 50 && year > ref_year - 50, "{} from {}", year, ref_year);
        }

        #[test]
        fn date_shaped_garbage_never_panics(
            text in "[A-Za-z0-9 ,:+\\-]{0,40}",
            reference in any::<i64>().prop_map(|s| s / 1000),
        ) {
            let _ = parse(&text, at(reference));
        }
    }
}
